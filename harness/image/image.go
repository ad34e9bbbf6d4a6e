// Package image builds the release images as image tarballs without a
// registry or a container engine, and checks what is in them. It uses
// github.com/google/go-containerregistry: a layer assembled from the
// static binaries (and, for the coordinator, the few files distroless
// would give it), appended to an empty image or to a base image read from
// a tarball, written with `docker save`'s layout (docker load, podman
// load, skopeo docker-archive:, ctr import read it).
//
// Builds are reproducible: file times and the image's creation time are
// zero, so the same binaries give the same digest.
//
// It is release tooling (make images), linked by no shipped binary.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// VersionLabel carries the build's VERSION.
const VersionLabel = "org.opencontainers.image.version"

// File is one file of the layer the build adds.
type File struct {
	Path string // absolute in the image
	Mode int64
	Src  string // file on this machine; empty: Data
	Data []byte
}

// Spec is one image.
type Spec struct {
	Ref        string // e.g. ghcr.io/cutover-dev/cutover-coordinator:v0.1.0
	Version    string
	Base       string // image tarball of the base; empty: scratch
	BaseRef    string // tag of the base in that tarball; empty: its only image
	Files      []File
	Dirs       []File // directories (Mode includes the sticky bit where wanted)
	Entrypoint []string
	User       string
}

// Coordinator is the coordinator image: coordinator and coordctl static,
// user 65532 (distroless' nonroot, numeric so runAsNonRoot can check it),
// /etc/passwd and /etc/group naming it, a /tmp. binDir holds the binaries
// (make build).
func Coordinator(ref, version, binDir string) Spec {
	return Spec{Ref: ref, Version: version, Entrypoint: []string{"/coordinator"}, User: "65532:65532",
		Files: []File{
			{Path: "/coordinator", Mode: 0o755, Src: path.Join(binDir, "coordinator")},
			{Path: "/coordctl", Mode: 0o755, Src: path.Join(binDir, "coordctl")},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		},
		Dirs: []File{{Path: "/tmp", Mode: 0o1777}, {Path: "/home/nonroot", Mode: 0o755}},
	}
}

// Agent is the agent image: the static agent on base, an image tarball
// that carries iptables (both backends) and nft, as Dockerfile.agent's
// runtime stage (debian:bookworm-slim + iptables nftables). The agent runs
// as root (privileged DaemonSet).
func Agent(ref, version, binDir, base string) Spec {
	return Spec{Ref: ref, Version: version, Base: base, Entrypoint: []string{"/usr/local/bin/cutover-agent"}, User: "0:0",
		Files: []File{{Path: "/usr/local/bin/cutover-agent", Mode: 0o755, Src: path.Join(binDir, "agent")}}}
}

// AgentTools are what the agent execs; the base must carry each, in one of
// the usual directories.
var AgentTools = []string{"iptables-nft", "iptables-nft-save", "iptables-legacy", "iptables-legacy-save", "nft"}

// Build writes s as an image tarball at out and returns the image's digest.
func Build(s Spec, out string) (v1.Hash, error) {
	ref, err := name.NewTag(s.Ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image ref %q: %w", s.Ref, err)
	}
	if s.Version == "" {
		return v1.Hash{}, errors.New("image version: empty (make passes VERSION)")
	}
	base := empty.Image
	if s.Base != "" {
		var tag *name.Tag
		if s.BaseRef != "" {
			t, err := name.NewTag(s.BaseRef)
			if err != nil {
				return v1.Hash{}, fmt.Errorf("base ref %q: %w", s.BaseRef, err)
			}
			tag = &t
		}
		if base, err = tarball.ImageFromPath(s.Base, tag); err != nil {
			return v1.Hash{}, fmt.Errorf("base image %s: %w", s.Base, err)
		}
	}
	layerTar, err := layer(s)
	if err != nil {
		return v1.Hash{}, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := mutate.Append(base, mutate.Addendum{Layer: l, History: v1.History{CreatedBy: "cutover make images", Created: v1.Time{Time: time.Unix(0, 0).UTC()}}})
	if err != nil {
		return v1.Hash{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User = s.Entrypoint, nil, s.User
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	cf.Config.Labels[VersionLabel] = s.Version
	cf.Config.Labels["org.opencontainers.image.source"] = "https://github.com/cutover-dev/cutover"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Hash{}, err
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return v1.Hash{}, fmt.Errorf("write %s: %w", out, err)
	}
	return img.Digest()
}

// layer is the tar of s's directories and files, parents first, with
// zero times and root ownership.
func layer(s Spec) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]int64{}
	for _, d := range s.Dirs {
		dirs[strings.TrimPrefix(d.Path, "/")] = d.Mode
	}
	for _, f := range s.Files {
		for p := path.Dir(strings.TrimPrefix(f.Path, "/")); p != "." && p != "/"; p = path.Dir(p) {
			if _, ok := dirs[p]; !ok {
				dirs[p] = 0o755
			}
		}
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names) // a parent sorts before its children
	for _, d := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: dirs[d], ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	for _, f := range s.Files {
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, fmt.Errorf("image file %s: %w (run make build first)", f.Path, err)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
