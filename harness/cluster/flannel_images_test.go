package cluster_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/cluster"
	"github.com/cutover-dev/cutover/harness/image"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// flannelRef is the flannel image's reference on the nodes: flannel's own
// repository and version, so the DaemonSet reads as upstream's.
const flannelRef = "ghcr.io/flannel-io/flannel:" + cluster.FlannelVersion

// buildFlannelImage builds the image the kube-flannel DaemonSet runs:
// flanneld (hack/flannel-tools.sh) at /opt/bin/flanneld as upstream's image
// has it, the CNI stand-in (harness/cluster/flannelcni, static) at
// /flannel as flannel's cni-plugin image has it, and from this machine the
// iptables (nft) flanneld runs, with their libraries and xtables
// extensions, and cp for the init containers. There is no registry and no
// Debian base tarball here; the binaries are the host's.
func buildFlannelImage(t *testing.T, dir string) string {
	t.Helper()
	if _, err := os.Stat(cluster.FlanneldPath()); err != nil {
		if testenv.InCI() {
			t.Fatalf("flanneld is not built at %s in CI: make cluster-tools runs hack/flannel-tools.sh", cluster.FlanneldPath())
		}
		t.Skipf("skipped: flanneld is not built at %s: run hack/flannel-tools.sh", cluster.FlanneldPath())
	}
	cni := filepath.Join(dir, "flannel-cni")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", cni, "./harness/cluster/flannelcni")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the flannel CNI stand-in: %v\n%s", err, out)
	}
	s := image.Spec{Ref: flannelRef, Version: cluster.FlannelVersion, Entrypoint: []string{"/opt/bin/flanneld"}, User: "0:0",
		Files: []image.File{
			{Path: "/opt/bin/flanneld", Mode: 0o755, Src: cluster.FlanneldPath()},
			{Path: "/flannel", Mode: 0o755, Src: cni},
		},
		Dirs: []image.File{{Path: "/tmp", Mode: 0o1777}, {Path: "/run", Mode: 0o755}, {Path: "/etc/kube-flannel", Mode: 0o755}}}
	seen := map[string]bool{}
	var add func(p string)
	add = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatalf("flannel image: %v", err)
		}
		s.Files = append(s.Files, image.File{Path: p, Mode: 0o755, Src: real})
		out, _ := exec.Command("ldd", real).Output()
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				add(f)
			}
		}
	}
	cp, err := exec.LookPath("cp")
	if err != nil {
		t.Fatal(err)
	}
	add(cp)
	s.Files = append(s.Files, image.File{Path: "/bin/cp", Mode: 0o755, Src: cp})
	add("/usr/sbin/xtables-nft-multi")
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		s.Files = append(s.Files, image.File{Path: "/usr/sbin/" + n, Mode: 0o755, Src: "/usr/sbin/xtables-nft-multi"})
	}
	xt, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	for _, x := range xt {
		s.Files = append(s.Files, image.File{Path: x, Mode: 0o644, Src: x})
	}
	out := filepath.Join(dir, "flannel.tar")
	img, err := image.Image(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := image.WriteOCI(out, flannelRef, img); err != nil {
		t.Fatal(err)
	}
	return out
}
