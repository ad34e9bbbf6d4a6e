package image

// The release images, built from real static binaries (built here with the
// Makefile's flags and a test VERSION) and, for the agent, the Debian
// packages hack/agent-debs.sh caches, read back from their OCI tarballs:
// config, files and modes; the binaries in them report VERSION; every tool
// the agent execs runs in the agent image (its libraries resolve, and as
// root it runs chrooted into the image's filesystem); builds are
// reproducible; and the check is not a rubber stamp.

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cutover-dev/cutover/harness/testenv"
)

const testVersion = "v0.0.0-imagetest"

var (
	buildMu  sync.Mutex
	binDirs  = map[string]string{}
	tempDirs []string
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range tempDirs {
		_ = os.RemoveAll(d)
	}
	os.Exit(code)
}

// binaries builds agent, coordinator, coordctl and cutover-pause for
// linux/arch as make images does.
func binaries(t *testing.T, arch string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if d, ok := binDirs[arch]; ok {
		return d
	}
	d, err := os.MkdirTemp("", "cutover-image-bin")
	if err != nil {
		t.Fatal(err)
	}
	tempDirs = append(tempDirs, d)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/cutover-dev/cutover/pkg/version.Version="+testVersion,
		"-o", d+"/", "./agent/cmd/agent", "./coordinator/cmd/coordinator", "./coordinator/cmd/coordctl", "./harness/cmd/cutover-pause")
	cmd.Dir, cmd.Env = "../..", append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build for %s: %v\n%s", arch, err, out)
	}
	binDirs[arch] = d
	return d
}

// debs is the cached packages.txt for arch. Without it the agent image
// tests skip, naming the command that fills the cache; in CI they fail.
func debs(t *testing.T, arch string) string {
	t.Helper()
	dir := os.Getenv("CUTOVER_CACHE_DIR")
	if dir == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(c, "cutover")
	}
	p := filepath.Join(dir, "debs", arch, "packages.txt")
	if _, err := os.Stat(p); err != nil {
		msg := "no Debian packages cached for " + arch + " (" + p + "): run make agent-debs"
		if testenv.InCI() {
			t.Fatal(msg + " (CI runs it before the tests)")
		}
		t.Skip(msg)
	}
	return p
}

// build writes specs (one per architecture) as one OCI tarball and reads
// back the image of each architecture.
func build(t *testing.T, file string, specs ...Spec) (v1.Hash, map[string]*Contents) {
	t.Helper()
	var imgs []v1.Image
	for _, s := range specs {
		img, err := Image(s)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	d, err := WriteOCI(file, specs[0].Ref, imgs...)
	if err != nil {
		t.Fatal(err)
	}
	cs := map[string]*Contents{}
	for _, s := range specs {
		c, err := Inspect(file, s.arch())
		if err != nil {
			t.Fatal(err)
		}
		if c.Digest != d {
			t.Fatalf("read back index digest %s, wrote %s", c.Digest, d)
		}
		cs[s.arch()] = c
	}
	return d, cs
}

// run runs the image's copy of file on this machine (same architecture)
// and returns its output.
func runFromImage(t *testing.T, c *Contents, file string, args ...string) string {
	t.Helper()
	e := c.Files[file]
	if e == nil {
		t.Fatalf("no %s in %s", file, c.Ref)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(file))
	if err := os.WriteFile(p, e.Data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v from the image: %v\n%s", file, args, err, out)
	}
	return string(out)
}

func TestCoordinatorAndPauseImages(t *testing.T) {
	dir := t.TempDir()
	var specs, pauses []Spec
	for _, a := range Arches {
		bin := binaries(t, a)
		specs = append(specs, Coordinator("ghcr.io/cutover-dev/cutover-coordinator:"+testVersion, testVersion, a, bin))
		pauses = append(pauses, Pause("ghcr.io/cutover-dev/cutover-pause:"+testVersion, testVersion, a, bin))
	}
	d1, cs := build(t, filepath.Join(dir, "a.tar"), specs...)
	for i, a := range Arches {
		c := cs[a]
		if p := c.Check(specs[i]); len(p) > 0 {
			t.Fatalf("check: %q", p)
		}
		// `kubectl exec deploy/cutover-coordinator -- coordctl` finds it.
		if p, e := c.Lookup("coordctl", c.pathDirs()); e == nil || p != "/usr/local/bin/coordctl" {
			t.Errorf("%s: coordctl not on the image's PATH %v", a, c.Env)
		}
		if c.User != "65532:65532" || c.Files["/tmp"].Mode&0o1777 != 0o1777 {
			t.Errorf("%s: user %q, /tmp mode %o", a, c.User, c.Files["/tmp"].Mode)
		}
		if c.Labels["org.opencontainers.image.title"] != "cutover-coordinator" {
			t.Errorf("%s: labels %v", a, c.Labels)
		}
	}
	if out := runFromImage(t, cs[runtime.GOARCH], "/usr/local/bin/coordctl", "version"); !strings.Contains(out, testVersion) {
		t.Fatalf("coordctl version from the image: %q, want %s", out, testVersion)
	}
	// Reproducible: the same binaries give the same digest and bytes.
	d2, _ := build(t, filepath.Join(dir, "b.tar"), specs...)
	if d1 != d2 || !sameFile(t, filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")) {
		t.Fatalf("second build: digest %s vs %s, or different bytes", d2, d1)
	}

	_, ps := build(t, filepath.Join(dir, "pause.tar"), pauses...)
	for i, a := range Arches {
		if p := ps[a].Check(pauses[i]); len(p) > 0 {
			t.Fatalf("pause check: %q", p)
		}
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func TestAgentImage(t *testing.T) {
	dir := t.TempDir()
	var specs []Spec
	for _, a := range Arches {
		specs = append(specs, Agent("ghcr.io/cutover-dev/cutover-agent:"+testVersion, testVersion, a, binaries(t, a), debs(t, a)))
	}
	d1, cs := build(t, filepath.Join(dir, "agent.tar"), specs...)
	for i, a := range Arches {
		if p := cs[a].Check(specs[i]); len(p) > 0 {
			t.Fatalf("check:\n%s", strings.Join(p, "\n"))
		}
	}
	c := cs[runtime.GOARCH]
	if out := runFromImage(t, c, "/usr/local/bin/cutover-agent", "--version"); strings.TrimSpace(out) != testVersion {
		t.Fatalf("agent --version from the image: %q, want %s", out, testVersion)
	}
	d2, _ := build(t, filepath.Join(dir, "agent2.tar"), specs...)
	if d1 != d2 || !sameFile(t, filepath.Join(dir, "agent.tar"), filepath.Join(dir, "agent2.tar")) {
		t.Fatalf("second build: digest %s vs %s, or different bytes", d2, d1)
	}
	// As root, each tool runs chrooted into the image's filesystem: the
	// image's own ld.so finds every library, as the check above modelled.
	if os.Geteuid() != 0 {
		t.Log("not root: the tools were not run chrooted into the image")
		return
	}
	root := t.TempDir()
	writeTree(t, c, root)
	for _, tool := range AgentTools {
		p, _ := c.Lookup(tool, c.pathDirs())
		args := map[string][]string{"ip": {"-V"}, "nft": {"--version"}}[tool]
		if args == nil {
			args = []string{"--version"}
		}
		if strings.HasSuffix(tool, "-save") {
			args = []string{"--help"} // -save reads the kernel; --version is not universal
		}
		cmd := exec.Command(p, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir, cmd.Env = "/", []string{"PATH=" + DefaultPath}
		out, err := cmd.CombinedOutput()
		if err != nil && strings.Contains(string(out), "error while loading shared libraries") || isNotFound(err) {
			t.Errorf("%s in the image: %v\n%s", tool, err, out)
		}
	}
}

func isNotFound(err error) bool {
	var pe *os.PathError
	return err != nil && (strings.Contains(err.Error(), "no such file") || errors.As(err, &pe))
}

// writeTree writes c's filesystem under dir (files, directories, symlinks).
func writeTree(t *testing.T, c *Contents, dir string) {
	t.Helper()
	paths := make([]string, 0, len(c.Files))
	for p := range c.Files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		e, dst := c.Files[p], filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch e.Type {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(e.Link, dst)
		case tar.TypeReg:
			err = os.WriteFile(dst, e.Data, os.FileMode(e.Mode&0o777))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The check names what an agent image lacks: a tool (no
// openvswitch-common: ovs-ofctl) and a library (no libnftables1: nft's
// libnftables.so.1).
func TestAgentImageCheckNamesWhatIsMissing(t *testing.T) {
	arch := runtime.GOARCH
	full := debs(t, arch)
	pkgs, err := ReadPackages(full)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	without := func(drop string) string {
		var b strings.Builder
		for _, p := range pkgs {
			if p.Name != drop {
				b.WriteString(p.Name + " " + p.Version + " " + filepath.Join(filepath.Dir(full), p.File) + "\n")
			}
		}
		f := filepath.Join(dir, drop+".txt")
		if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for drop, want := range map[string][]string{
		"openvswitch-common": {"ovs-ofctl: not on the image's PATH"},
		"libnftables1":       {"nft (/usr/sbin/nft): does not resolve in the image: libnftables.so.1 (needed by nft)"},
	} {
		s := Agent("ghcr.io/cutover-dev/cutover-agent:"+testVersion, testVersion, arch, binaries(t, arch), without(drop))
		_, cs := build(t, filepath.Join(dir, drop+".tar"), s)
		got := strings.Join(cs[arch].Check(s), "\n")
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("without %s: check did not report %q; it reported:\n%s", drop, w, got)
			}
		}
	}
}

// The check fails on images that are not what the spec says.
func TestCheckFailsOnWrongImage(t *testing.T) {
	bin := binaries(t, runtime.GOARCH)
	dir := t.TempDir()
	s := Coordinator("ghcr.io/cutover-dev/cutover-coordinator:"+testVersion, testVersion, runtime.GOARCH, bin)
	_, cs := build(t, filepath.Join(dir, "c.tar"), s)
	want := s
	want.User, want.Version, want.Env = "0:0", "v9.9.9", nil
	want.Files = append(slices.Clone(want.Files), File{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644})
	p := strings.Join(cs[runtime.GOARCH].Check(want), "\n")
	for _, w := range []string{`user "65532:65532", want "0:0"`, `want "v9.9.9" (VERSION)`, "no /etc/ssl/certs/ca-certificates.crt", "env "} {
		if !strings.Contains(p, w) {
			t.Errorf("check problems %q lack %q", p, w)
		}
	}
	if _, err := Image(Spec{Ref: "x:1", Entrypoint: []string{"/x"}}); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("a build without VERSION: %v", err)
	}
	if _, err := Image(Spec{Ref: "Bad Ref", Version: "v1"}); err == nil || !strings.Contains(err.Error(), `image ref "Bad Ref"`) {
		t.Errorf("a bad ref: %v", err)
	}
}
