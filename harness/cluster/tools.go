package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// ContainerdVersion is the containerd built from its Go module by
// hack/kube-tools.sh containerd (kept in step with it: a test checks).
const ContainerdVersion = "v2.4.2"

// kubeBin is a Kubernetes binary hack/kube-tools.sh cached.
func kubeBin(name string) string {
	return filepath.Join(kubetest.CacheDir(), name+"-"+kubetest.KubernetesVersion)
}

// KubectlPath is the pinned kubectl.
func KubectlPath() string { return kubeBin("kubectl") }

// ContainerdDir holds containerd, containerd-shim-runc-v2 and ctr.
func ContainerdDir() string {
	return filepath.Join(kubetest.CacheDir(), "containerd-"+ContainerdVersion)
}

// CNIPluginDir is where Debian's containernetworking-plugins installs the
// reference plugins (bridge, host-local, loopback, portmap).
const CNIPluginDir = "/usr/lib/cni"

// Missing says what the real-cluster tier lacks here, each with its fix.
func Missing() []string {
	var why []string
	for _, n := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		if !executable(kubeBin(n)) {
			why = append(why, fmt.Sprintf("%s is not built at %s: run hack/kube-tools.sh cluster", n, kubeBin(n)))
		}
	}
	for _, n := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if p := filepath.Join(ContainerdDir(), n); !executable(p) {
			why = append(why, fmt.Sprintf("%s is not built at %s: run hack/kube-tools.sh containerd", n, p))
		}
	}
	if _, err := kubetest.EtcdPath(); err != nil {
		why = append(why, "etcd is not installed: apt-get install etcd-server")
	}
	for bin, pkg := range map[string]string{"runc": "runc", "nsenter": "util-linux", "unshare": "util-linux", "iptables": "iptables", "ip": "iproute2", "conntrack": "conntrack"} {
		if _, err := exec.LookPath(bin); err != nil {
			why = append(why, bin+" is not installed: apt-get install "+pkg)
		}
	}
	if !executable(filepath.Join(CNIPluginDir, "bridge")) {
		why = append(why, "the CNI reference plugins are not in "+CNIPluginDir+": apt-get install containernetworking-plugins")
	}
	return why
}

// Require skips the test (fails it in CI, where .ci/run provides
// everything) unless the tier can run: root and every binary above. The
// tier is slow, so -short skips it too.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipped in -short mode: the real-cluster tier runs kubelets and containerd")
	}
	testenv.RequireRoot(t)
	if why := Missing(); len(why) > 0 {
		if testenv.InCI() {
			t.Fatalf("real-cluster tier prerequisite missing in CI: %s", strings.Join(why, "; "))
		}
		t.Skip("skipped: " + strings.Join(why, "; "))
	}
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
