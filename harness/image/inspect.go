package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Contents is what an image tarball holds: its config and its flattened
// filesystem (path → mode; regular files also by content, for the
// binaries).
type Contents struct {
	Ref        string
	Entrypoint []string
	User       string
	Labels     map[string]string
	Modes      map[string]int64 // "/coordinator" → 0755
	Data       map[string][]byte
}

// Inspect reads an image tarball written by Build (or docker save) for
// ref.
func Inspect(file, ref string) (*Contents, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return nil, err
	}
	img, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", file, ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	c := &Contents{Ref: ref, Entrypoint: cf.Config.Entrypoint, User: cf.Config.User, Labels: cf.Config.Labels,
		Modes: map[string]int64{}, Data: map[string][]byte{}}
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		p := "/" + strings.TrimSuffix(strings.TrimPrefix(path.Clean("/"+h.Name), "/"), "/")
		c.Modes[p] = h.Mode
		if h.Typeflag == tar.TypeReg && strings.HasPrefix(p, "/") && (p == "/coordinator" || p == "/coordctl" || strings.HasSuffix(p, "/cutover-agent")) {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			c.Data[p] = b
		}
	}
	return c, nil
}

// toolDirs are where an image's PATH finds the agent's tools.
var toolDirs = []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin"}

// Check holds c to s: entrypoint, user, the version label, every file of
// s present with its mode and, for the agent, the tools it execs. It
// returns every problem.
func (c *Contents) Check(s Spec) []string {
	var out []string
	bad := func(f string, a ...any) { out = append(out, fmt.Sprintf(c.Ref+": "+f, a...)) }
	if !slices.Equal(c.Entrypoint, s.Entrypoint) {
		bad("entrypoint %q, want %q", c.Entrypoint, s.Entrypoint)
	}
	if c.User != s.User {
		bad("user %q, want %q", c.User, s.User)
	}
	if v := c.Labels[VersionLabel]; v != s.Version {
		bad("label %s=%q, want %q (VERSION)", VersionLabel, v, s.Version)
	}
	for _, f := range s.Files {
		m, ok := c.Modes[f.Path]
		switch {
		case !ok:
			bad("no %s", f.Path)
		case m&0o7777 != f.Mode:
			bad("%s has mode %o, want %o", f.Path, m&0o7777, f.Mode)
		}
	}
	if len(s.Entrypoint) > 0 {
		if m, ok := c.Modes[s.Entrypoint[0]]; !ok || m&0o111 == 0 {
			bad("entrypoint %s is not an executable file in the image", s.Entrypoint[0])
		}
	}
	if strings.HasPrefix(s.Entrypoint[0], "/usr/local/bin/cutover-agent") {
		for _, tool := range AgentTools {
			if !slices.ContainsFunc(toolDirs, func(d string) bool { _, ok := c.Modes[d+"/"+tool]; return ok }) {
				bad("no %s in %s: the agent execs it (the base must carry Debian's iptables and nftables)", tool, strings.Join(toolDirs, ", "))
			}
		}
	}
	return out
}
