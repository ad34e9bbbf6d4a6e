// Package image builds the release images as image tarballs without a
// registry or a container engine, and checks what is in them. It uses
// github.com/google/go-containerregistry: layers assembled here (the
// static binaries; for the agent, a Debian root extracted from the .deb
// files hack/agent-debs.sh caches), one image per architecture, written
// as one OCI image layout tarball per image name whose index holds every
// architecture (`ctr -n k8s.io images import`, `docker load` from Docker
// 25 on, `skopeo copy oci-archive:` read it). Importing keeps the digests,
// so manifests pinned to the index digest (make release) find the image.
//
// Builds are reproducible: sorted tar entries, zero file times, owner
// 0:0, and no time in the image config, so the same binaries and .deb
// files give the same digest.
//
// It is release tooling (make images, make release), linked by no shipped
// binary.
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

// Arches are the architectures a release builds (linux only).
var Arches = []string{"amd64", "arm64"}

// epoch is every time in a layer or config: reproducible digests.
var epoch = time.Unix(0, 0).UTC()

// File is one file of the layer the build adds.
type File struct {
	Path string // absolute in the image
	Mode int64
	Src  string // file on this machine; empty: Data
	Data []byte
}

// Spec is one image for one architecture.
type Spec struct {
	Ref     string // e.g. ghcr.io/cutover-dev/cutover-coordinator:v0.1.0
	Version string
	Arch    string // GOARCH; empty: amd64
	// Debs is a packages.txt of hack/agent-debs.sh: the Debian packages
	// the image's root is assembled from (first layer); empty: none.
	Debs       string
	Files      []File
	Dirs       []File // directories (Mode includes the sticky bit where wanted)
	Entrypoint []string
	User       string
	Env        []string
}

func (s Spec) arch() string {
	if s.Arch == "" {
		return "amd64"
	}
	return s.Arch
}

// Coordinator is the coordinator image: coordinator and coordctl static
// in /usr/local/bin (on PATH, so `kubectl exec deploy/cutover-coordinator
// -- coordctl ...` finds it), user 65532 (distroless' nonroot, numeric so
// runAsNonRoot can check it), /etc/passwd and /etc/group naming it, a
// /tmp. binDir holds the binaries for s.Arch.
func Coordinator(ref, version, arch, binDir string) Spec {
	return Spec{Ref: ref, Version: version, Arch: arch, Entrypoint: []string{"/usr/local/bin/coordinator"}, User: "65532:65532",
		Env: []string{"PATH=" + DefaultPath},
		Files: []File{
			{Path: "/usr/local/bin/coordinator", Mode: 0o755, Src: path.Join(binDir, "coordinator")},
			{Path: "/usr/local/bin/coordctl", Mode: 0o755, Src: path.Join(binDir, "coordctl")},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		},
		Dirs: []File{{Path: "/tmp", Mode: 0o1777}, {Path: "/home/nonroot", Mode: 0o755}},
	}
}

// AgentPackages are the Debian packages the agent image is assembled
// from (with their Depends closure, hack/agent-debs.sh); Dockerfile.agent
// installs the same set (deploy/images_test.go). iptables: both backends'
// iptables and *-save; nftables: nft; openvswitch-common: ovs-ofctl;
// openvswitch-switch: ovs-vsctl for an operator in the agent's container
// (the agent itself speaks OVSDB, pkg/ovs; Debian ships ovs-vsctl beside
// the daemons, which the image never runs); iproute2: ip, which pkg/openflow runs for a client in a
// network namespace. No conntrack: pkg/conntrack speaks netlink.
var AgentPackages = []string{"iptables", "nftables", "openvswitch-common", "openvswitch-switch", "iproute2"}

// AgentTools are what the agent can exec (TestAgentToolsAreWhatTheCodeExecs
// derives them from the code); the image must carry each, runnable. Plain
// iptables is Debian's default alternative (iptables-nft), which pkg/iptables
// asks for its --version when both backends hold as many rules.
var AgentTools = []string{"iptables", "iptables-legacy", "iptables-legacy-save", "iptables-nft", "iptables-nft-save", "ip", "nft", "ovs-ofctl"}

// DefaultPath is the PATH of every image (Debian's root PATH).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Agent is the agent image: the static agent on a Debian root assembled
// from debs (a packages.txt of hack/agent-debs.sh for arch). The agent
// runs as root (privileged DaemonSet).
func Agent(ref, version, arch, binDir, debs string) Spec {
	return Spec{Ref: ref, Version: version, Arch: arch, Debs: debs, Entrypoint: []string{"/usr/local/bin/cutover-agent"}, User: "0:0",
		Env:   []string{"PATH=" + DefaultPath},
		Files: []File{{Path: "/usr/local/bin/cutover-agent", Mode: 0o755, Src: path.Join(binDir, "agent")}}}
}

// Pause is the sandbox (pause) image for nodes without a registry:
// cutover-pause, static, waits for SIGTERM or SIGINT and exits 0.
func Pause(ref, version, arch, binDir string) Spec {
	return Spec{Ref: ref, Version: version, Arch: arch, Entrypoint: []string{"/pause"}, User: "65535:65535",
		Files: []File{{Path: "/pause", Mode: 0o755, Src: path.Join(binDir, "cutover-pause")}}}
}

// Image builds s.
func Image(s Spec) (v1.Image, error) {
	if _, err := name.NewTag(s.Ref); err != nil {
		return nil, fmt.Errorf("image ref %q: %w", s.Ref, err)
	}
	if s.Version == "" {
		return nil, errors.New("image version: empty (make passes VERSION)")
	}
	var adds []mutate.Addendum
	if s.Debs != "" {
		root, err := DebianRoot(s.Debs, s.arch())
		if err != nil {
			return nil, err
		}
		adds = append(adds, addendum(root, "debian packages of "+path.Base(path.Dir(s.Debs))+"/packages.txt"))
	}
	own, err := layer(s)
	if err != nil {
		return nil, err
	}
	adds = append(adds, addendum(own, "cutover make images"))
	img, err := mutate.Append(empty.Image, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", s.arch()
	if s.arch() == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, cf.Config.Env = s.Entrypoint, nil, s.User, s.Env
	cf.Config.Labels = map[string]string{
		VersionLabel:                      s.Version,
		"org.opencontainers.image.source": "https://github.com/cutover-dev/cutover",
		"org.opencontainers.image.title":  path.Base(refRepo(s.Ref)),
	}
	return mutate.ConfigFile(img, cf)
}

// refRepo is ref without its tag.
func refRepo(ref string) string {
	if t, err := name.NewTag(ref); err == nil {
		return t.Context().Name()
	}
	return ref
}

func addendum(tarBytes []byte, by string) mutate.Addendum {
	l, _ := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil })
	return mutate.Addendum{Layer: l, History: v1.History{CreatedBy: by, Created: v1.Time{Time: epoch}}}
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
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: dirs[d], ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	files := append([]File(nil), s.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, fmt.Errorf("image file %s: %w (run make build first)", f.Path, err)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
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
