package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Entry is one path of an image's flattened filesystem.
type Entry struct {
	Type byte // tar.TypeReg, tar.TypeDir, tar.TypeSymlink, ...
	Mode int64
	Link string // symlink target
	Data []byte // regular files
}

// Contents is what an image tarball holds for one architecture: its
// name and index digest, its config, and its flattened filesystem.
type Contents struct {
	Ref        string
	Digest     v1.Hash // the image index's: what manifests pin
	Arch       string
	Entrypoint []string
	User       string
	Env        []string
	Labels     map[string]string
	Files      map[string]*Entry // "/usr/local/bin/coordctl" → ...
}

// Inspect reads the linux/arch image of an OCI layout tarball written by
// WriteOCI, filesystem included (mutate.Extract: the layers flattened
// with whiteouts applied).
func Inspect(file, arch string) (*Contents, error) {
	var c *Contents
	err := readOCI(file, arch, func(ref string, d v1.Hash, img v1.Image) error {
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		c = &Contents{Ref: ref, Digest: d, Arch: cf.Architecture, Entrypoint: cf.Config.Entrypoint, User: cf.Config.User,
			Env: cf.Config.Env, Labels: cf.Config.Labels, Files: map[string]*Entry{}}
		rc := mutate.Extract(img)
		defer func() { _ = rc.Close() }()
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			e := &Entry{Type: h.Typeflag, Mode: h.Mode, Link: h.Linkname}
			if h.Typeflag == tar.TypeReg {
				if e.Data, err = io.ReadAll(tr); err != nil {
					return err
				}
			}
			c.Files[path.Clean("/"+h.Name)] = e
		}
	})
	return c, err
}

// resolve follows symlinks (in every component) inside the image and
// returns the final path and its entry, or nil.
func (c *Contents) resolve(p string) (string, *Entry) {
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
		cur, moved := "/", false
		for i, part := range parts {
			next := path.Join(cur, part)
			e := c.Files[next]
			if e == nil {
				return next, nil
			}
			if e.Type == tar.TypeSymlink {
				t := e.Link
				if !path.IsAbs(t) {
					t = path.Join(cur, t)
				}
				p, moved = path.Join(append([]string{t}, parts[i+1:]...)...), true
				break
			}
			cur = next
		}
		if !moved {
			return cur, c.Files[cur]
		}
	}
	return p, nil
}

// Lookup finds name on dirs as a shell's PATH search would.
func (c *Contents) Lookup(name string, dirs []string) (string, *Entry) {
	for _, d := range dirs {
		if p, e := c.resolve(path.Join(d, name)); e != nil && e.Type == tar.TypeReg && e.Mode&0o111 != 0 {
			return p, e
		}
	}
	return "", nil
}

// pathDirs is the image's PATH (its config's Env), or DefaultPath.
func (c *Contents) pathDirs() []string {
	for _, e := range c.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			return strings.Split(v, ":")
		}
	}
	return strings.Split(DefaultPath, ":")
}

// machines and multiarch triplets of the architectures built.
var (
	elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	triplet    = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
)

// Runnable says why name cannot run in the image ("" when it can): it is
// found on the image's PATH as an executable file, it is an ELF for the
// image's architecture (or a script whose interpreter is there), and its
// interpreter and every library it needs, transitively, resolve inside
// the image as Debian's ld.so searches: DT_RUNPATH/DT_RPATH, then
// /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib.
func (c *Contents) Runnable(name string) string {
	p, e := c.Lookup(name, c.pathDirs())
	if e == nil {
		return fmt.Sprintf("%s: not on the image's PATH (%s)", name, strings.Join(c.pathDirs(), ":"))
	}
	if bytes.HasPrefix(e.Data, []byte("#!")) {
		line, _, _ := bytes.Cut(e.Data[2:], []byte("\n"))
		f := strings.Fields(string(line))
		if len(f) == 0 {
			return fmt.Sprintf("%s (%s): empty #! line", name, p)
		}
		if _, ie := c.resolve(f[0]); ie == nil {
			return fmt.Sprintf("%s (%s): interpreter %s not in the image", name, p, f[0])
		}
		return ""
	}
	var missing []string
	seen := map[string]bool{}
	var walk func(file string, data []byte, interp bool) string
	walk = func(file string, data []byte, top bool) string {
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return fmt.Sprintf("%s: not an ELF file: %v", file, err)
		}
		if want := elfMachine[c.Arch]; f.Machine != want {
			return fmt.Sprintf("%s: ELF for %s, the image is %s", file, f.Machine, c.Arch)
		}
		if top {
			for _, prog := range f.Progs {
				if prog.Type != elf.PT_INTERP {
					continue
				}
				b, _ := io.ReadAll(prog.Open())
				interp := strings.TrimRight(string(b), "\x00")
				if _, ie := c.resolve(interp); ie == nil {
					missing = append(missing, "interpreter "+interp)
				}
			}
		}
		needed, _ := f.DynString(elf.DT_NEEDED)
		var search []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			rp, _ := f.DynString(tag)
			for _, r := range rp {
				for _, d := range strings.Split(r, ":") {
					search = append(search, strings.ReplaceAll(d, "$ORIGIN", path.Dir(file)))
				}
			}
		}
		t := triplet[c.Arch]
		search = append(search, "/lib/"+t, "/usr/lib/"+t, "/lib", "/usr/lib")
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			found := false
			for _, d := range search {
				lp, le := c.resolve(path.Join(d, lib))
				if le == nil || le.Type != tar.TypeReg {
					continue
				}
				found = true
				if msg := walk(lp, le.Data, false); msg != "" {
					return msg
				}
				break
			}
			if !found {
				missing = append(missing, lib+" (needed by "+path.Base(file)+")")
			}
		}
		return ""
	}
	if msg := walk(p, e.Data, true); msg != "" {
		return name + ": " + msg
	}
	if len(missing) > 0 {
		return fmt.Sprintf("%s (%s): does not resolve in the image: %s", name, p, strings.Join(missing, ", "))
	}
	return ""
}

// Check holds c to s: entrypoint, user, the version label, PATH, every
// file of s present with its mode and, for the agent, every tool it execs
// runnable. It returns every problem.
func (c *Contents) Check(s Spec) []string {
	var out []string
	bad := func(f string, a ...any) { out = append(out, fmt.Sprintf(s.Ref+" ("+c.Arch+"): "+f, a...)) }
	if c.Ref != s.Ref {
		bad("named %q, want %q", c.Ref, s.Ref)
	}
	if c.Arch != s.arch() {
		bad("architecture %s, want %s", c.Arch, s.arch())
	}
	if !slices.Equal(c.Entrypoint, s.Entrypoint) {
		bad("entrypoint %q, want %q", c.Entrypoint, s.Entrypoint)
	}
	if c.User != s.User {
		bad("user %q, want %q", c.User, s.User)
	}
	if !slices.Equal(c.Env, s.Env) {
		bad("env %q, want %q", c.Env, s.Env)
	}
	if v := c.Labels[VersionLabel]; v != s.Version {
		bad("label %s=%q, want %q (VERSION)", VersionLabel, v, s.Version)
	}
	for _, f := range s.Files {
		e := c.Files[f.Path]
		switch {
		case e == nil:
			bad("no %s", f.Path)
		case e.Mode&0o7777 != f.Mode:
			bad("%s has mode %o, want %o", f.Path, e.Mode&0o7777, f.Mode)
		}
	}
	if len(s.Entrypoint) > 0 {
		if _, e := c.resolve(s.Entrypoint[0]); e == nil || e.Mode&0o111 == 0 {
			bad("entrypoint %s is not an executable file in the image", s.Entrypoint[0])
		}
	}
	if s.Debs != "" {
		for _, tool := range AgentTools {
			if msg := c.Runnable(tool); msg != "" {
				bad("%s: the agent execs it", msg)
			}
		}
	}
	return out
}
