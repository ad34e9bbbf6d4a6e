package cluster_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/image"
)

// e2eImages are the image tarballs the tier imports into every node.
type e2eImages struct {
	dir                        string
	version                    string
	agent, coordinator, pause  string // tarballs
	agentV2                    string // the upgrade's agent tarball, once built
	agentRef, coordRef, pauseR string
}

const (
	agentRepo = "ghcr.io/cutover-dev/cutover-agent"
	coordRepo = "ghcr.io/cutover-dev/cutover-coordinator"
	pauseRef  = "registry.k8s.io/pause:3.10"
)

// buildImages builds the shipped binaries and their images, as make
// images does, into a directory of the test's.
func buildImages(t *testing.T, version string) e2eImages {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	root := repoRoot(t)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/cutover-dev/cutover/pkg/version.Version="+version, "-o", bin+"/",
		"./agent/cmd/agent", "./coordinator/cmd/coordinator", "./coordinator/cmd/coordctl", "./coordinator/cmd/kubectl-cutover")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	im := e2eImages{dir: dir, version: version,
		agentRef: agentRepo + ":" + version, coordRef: coordRepo + ":" + version, pauseR: pauseRef}
	im.coordinator = filepath.Join(dir, "coordinator.tar")
	if _, err := image.Build(image.Coordinator(im.coordRef, version, bin), im.coordinator); err != nil {
		t.Fatal(err)
	}
	im.agent = filepath.Join(dir, "agent.tar")
	if _, err := image.Build(agentSpec(t, im.agentRef, version, bin, dir), im.agent); err != nil {
		t.Fatal(err)
	}
	im.pause = filepath.Join(dir, "pause.tar")
	if _, err := image.Build(pauseSpec(t, dir), im.pause); err != nil {
		t.Fatal(err)
	}
	return im
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// PROTOTYPE: replaced by the Debian-package base.
func agentSpec(t *testing.T, ref, version, bin, dir string) image.Spec {
	s := image.Spec{Ref: ref, Version: version, Entrypoint: []string{"/usr/local/bin/cutover-agent"}, User: "0:0",
		Files: []image.File{{Path: "/usr/local/bin/cutover-agent", Mode: 0o755, Src: filepath.Join(bin, "agent")}},
		Dirs:  []image.File{{Path: "/tmp", Mode: 0o1777}, {Path: "/run", Mode: 0o755}}}
	seen := map[string]bool{}
	add := func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatal(err)
		}
		s.Files = append(s.Files, image.File{Path: p, Mode: 0o755, Src: real})
	}
	for _, b := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/nft", "/usr/bin/ovs-vsctl", "/usr/bin/ovs-ofctl"} {
		add(b)
		out, _ := exec.Command("ldd", b).Output()
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			for _, x := range f {
				if strings.HasPrefix(x, "/") {
					add(x)
				}
			}
		}
	}
	for _, n := range []string{"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "iptables", "iptables-save", "iptables-restore"} {
		s.Files = append(s.Files, image.File{Path: "/usr/sbin/" + n, Mode: 0o755, Src: "/usr/sbin/xtables-nft-multi"})
	}
	for _, n := range []string{"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore"} {
		s.Files = append(s.Files, image.File{Path: "/usr/sbin/" + n, Mode: 0o755, Src: "/usr/sbin/xtables-legacy-multi"})
	}
	xt, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	for _, x := range xt {
		s.Files = append(s.Files, image.File{Path: x, Mode: 0o644, Src: x})
	}
	return s
}

func pauseSpec(t *testing.T, dir string) image.Spec {
	return image.Spec{Ref: pauseRef, Version: "3.10", Entrypoint: []string{"/pause"}, User: "65535:65535",
		Files: []image.File{{Path: "/pause", Mode: 0o755, Src: "/tmp/pausebuild/pause"}}}
}
