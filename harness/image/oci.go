package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on the tarball's index.json entry: containerd's import names
// the image from the first, Docker's OCI export sets both the same way.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

// WriteOCI writes imgs (one per architecture) as an OCI image layout
// tarball at out: index.json names ref and points at an image index of
// imgs, whose digest it returns (what manifests pin: ref@digest).
func WriteOCI(out, ref string, imgs ...v1.Image) (v1.Hash, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image ref %q: %w", ref, err)
	}
	var adds []mutate.IndexAddendum
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return v1.Hash{}, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	d, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	dir, err := os.MkdirTemp("", "cutover-oci")
	if err != nil {
		return v1.Hash{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationImageName: tag.Name(), annotationRefName: tag.TagStr()})); err != nil {
		return v1.Hash{}, err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeTreeTar(f, dir); err != nil {
		_ = f.Close()
		return v1.Hash{}, fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return v1.Hash{}, err
	}
	return d, os.Rename(tmp, out)
}

// writeTreeTar streams dir's regular files and directories as a tar,
// sorted, owner 0:0, time 0.
func writeTreeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// readOCI reads an OCI layout tarball written by WriteOCI and calls fn
// with the name its index.json gives, the image index's digest and the
// image for arch, which is readable only during fn.
func readOCI(file, arch string, fn func(ref string, digest v1.Hash, img v1.Image) error) error {
	dir, err := os.MkdirTemp("", "cutover-oci-read")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := untar(file, dir); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return fmt.Errorf("%s: not an OCI layout: %w", file, err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return err
	}
	if len(im.Manifests) != 1 {
		return fmt.Errorf("%s: index.json holds %d entries, want 1", file, len(im.Manifests))
	}
	e := im.Manifests[0]
	idx, err := top.ImageIndex(e.Digest)
	if err != nil {
		return err
	}
	ch, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, m := range ch.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == arch {
			img, err := idx.Image(m.Digest)
			if err != nil {
				return err
			}
			return fn(e.Annotations[annotationImageName], e.Digest, img)
		}
	}
	return fmt.Errorf("%s: no linux/%s image in its index", file, arch)
}

// untar writes file's regular files and directories under dir; the
// tarball is Cutover's own, but a name leaving dir is refused.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the layout", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			w, err := os.Create(p)
			if err != nil {
				return err
			}
			if _, err := io.Copy(w, tr); err != nil {
				_ = w.Close()
				return err
			}
			if err := w.Close(); err != nil {
				return err
			}
		}
	}
}
