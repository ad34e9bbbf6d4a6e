package image

// The release images, built from real static binaries (built here with the
// Makefile's flags and a test VERSION), read back from their tarballs:
// entrypoint, user, version label, files and modes; the binaries in them
// report VERSION; a build is reproducible; and the check is not a rubber
// stamp (a wrong user, a missing file, an agent base without nft fail).

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const testVersion = "v0.0.0-imagetest"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildErr == nil && binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds agent, coordinator and coordctl as make build does.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "cutover-image-bin")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/cutover-dev/cutover/pkg/version.Version="+testVersion,
			"-o", binDir+"/", "./agent/cmd/agent", "./coordinator/cmd/coordinator", "./coordinator/cmd/coordctl")
		cmd.Dir, cmd.Env = "../..", append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = err
			binDir = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, binDir)
	}
	return binDir
}

func TestCoordinatorImage(t *testing.T) {
	bin := binaries(t)
	dir := t.TempDir()
	s := Coordinator("ghcr.io/cutover-dev/cutover-coordinator:"+testVersion, testVersion, bin)
	d1, err := Build(s, filepath.Join(dir, "a.tar"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Inspect(filepath.Join(dir, "a.tar"), s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Check(s); len(p) > 0 {
		t.Fatalf("check: %q", p)
	}
	if !slices.Equal(c.Entrypoint, []string{"/coordinator"}) || c.User != "65532:65532" || c.Labels[VersionLabel] != testVersion {
		t.Fatalf("config: entrypoint %q user %q labels %v", c.Entrypoint, c.User, c.Labels)
	}
	if c.Modes["/tmp"]&0o1777 != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", c.Modes["/tmp"])
	}
	// The binary in the image is the one built for VERSION.
	ctl := filepath.Join(dir, "coordctl")
	if err := os.WriteFile(ctl, c.Data["/coordctl"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ctl, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), testVersion) {
		t.Fatalf("coordctl version from the image: %v %q, want %s", err, out, testVersion)
	}
	// Reproducible: the same binaries give the same digest.
	d2, err := Build(s, filepath.Join(dir, "b.tar"))
	if err != nil || d1 != d2 {
		t.Fatalf("second build: %v, digest %s vs %s", err, d2, d1)
	}
}

func TestAgentImageOnABase(t *testing.T) {
	bin := binaries(t)
	dir := t.TempDir()
	// A stand-in base with the tool paths Debian's iptables and nftables
	// packages install (the tools themselves are not run here).
	tools := func(names ...string) Spec {
		s := Spec{Ref: "example.invalid/base:1", Version: "base", Entrypoint: []string{"/bin/sh"}, User: "0:0",
			Files: []File{{Path: "/bin/sh", Mode: 0o755, Data: []byte("#!")}}}
		for _, n := range names {
			s.Files = append(s.Files, File{Path: "/usr/sbin/" + n, Mode: 0o755, Data: []byte("stub")})
		}
		return s
	}
	if _, err := Build(tools(AgentTools...), filepath.Join(dir, "base.tar")); err != nil {
		t.Fatal(err)
	}
	s := Agent("ghcr.io/cutover-dev/cutover-agent:"+testVersion, testVersion, bin, filepath.Join(dir, "base.tar"))
	if _, err := Build(s, filepath.Join(dir, "agent.tar")); err != nil {
		t.Fatal(err)
	}
	c, err := Inspect(filepath.Join(dir, "agent.tar"), s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Check(s); len(p) > 0 {
		t.Fatalf("check: %q", p)
	}
	if _, ok := c.Modes["/bin/sh"]; !ok {
		t.Error("the base's files are not in the image")
	}
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, c.Data["/usr/local/bin/cutover-agent"], 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(agent, "--version").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != testVersion {
		t.Fatalf("agent --version from the image: %v %q, want %s", err, out, testVersion)
	}

	// Bite: a base without nft is caught.
	if _, err := Build(tools("iptables-nft", "iptables-nft-save", "iptables-legacy", "iptables-legacy-save"), filepath.Join(dir, "base2.tar")); err != nil {
		t.Fatal(err)
	}
	s2 := Agent(s.Ref, testVersion, bin, filepath.Join(dir, "base2.tar"))
	if _, err := Build(s2, filepath.Join(dir, "agent2.tar")); err != nil {
		t.Fatal(err)
	}
	c2, err := Inspect(filepath.Join(dir, "agent2.tar"), s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if p := strings.Join(c2.Check(s2), ";"); !strings.Contains(p, "no nft in") {
		t.Fatalf("a base without nft passed the check: %q", p)
	}
}

// The check fails on images that are not what the spec says.
func TestCheckFailsOnWrongImage(t *testing.T) {
	bin := binaries(t)
	dir := t.TempDir()
	s := Coordinator("ghcr.io/cutover-dev/cutover-coordinator:"+testVersion, testVersion, bin)
	if _, err := Build(s, filepath.Join(dir, "c.tar")); err != nil {
		t.Fatal(err)
	}
	c, err := Inspect(filepath.Join(dir, "c.tar"), s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	want := s
	want.User, want.Version = "0:0", "v9.9.9"
	want.Files = append(slices.Clone(want.Files), File{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644})
	p := strings.Join(c.Check(want), "\n")
	for _, w := range []string{`user "65532:65532", want "0:0"`, `want "v9.9.9" (VERSION)`, "no /etc/ssl/certs/ca-certificates.crt"} {
		if !strings.Contains(p, w) {
			t.Errorf("check problems %q lack %q", p, w)
		}
	}
	if _, err := Build(Spec{Ref: "x:1", Entrypoint: []string{"/x"}}, filepath.Join(dir, "d.tar")); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("a build without VERSION: %v", err)
	}
	if _, err := Build(Spec{Ref: "Bad Ref", Version: "v1"}, filepath.Join(dir, "e.tar")); err == nil || !strings.Contains(err.Error(), `image ref "Bad Ref"`) {
		t.Errorf("a bad ref: %v", err)
	}
}
