package agent

import (
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/ifaddr"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// The agent's discovery through the real driver, per backend, in a fresh
// namespace: OVS finds tun0's address, kernel-vxlan the VXLAN device's.
func TestOverlayAddressOnRealInterfaces(t *testing.T) {
	ns := testenv.Netns(t, "cot-agentaddr")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "198.18.0.1/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"link", "add", "vxlan.calico", "type", "vxlan", "id", "4096", "local", "198.18.0.1", "dev", "eth0", "dstport", "4789", "nolearning"},
		{"addr", "add", "198.19.3.1/32", "dev", "vxlan.calico"},
		{"link", "set", "vxlan.calico", "up"},
		{"tuntap", "add", "dev", "tun0", "mode", "tap"},
		{"addr", "add", "198.19.1.1/24", "dev", "tun0"},
	} {
		if out, err := netns.Command(ns, append([]string{"ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	k, err := ifaddr.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ovs := Default()
	kernel := Default()
	kernel.Backend, kernel.KernelDevice = BackendKernelVXLAN, "vxlan.calico"
	flannel := kernel
	flannel.KernelDevice = "flannel.1"
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"ovs", ovs, "198.19.1.1:9445"},
		{"kernel-vxlan calico", kernel, "198.19.3.1:9445"},
		{"kernel-vxlan flannel.1 missing", flannel, ""},
	} {
		got, why := overlayAddress(tc.cfg, k)
		if (tc.want == "" && (got.IsValid() || !strings.Contains(why, "flannel.1 does not exist"))) || (tc.want != "" && got.String() != tc.want) {
			t.Errorf("%s: %v (%q), want %q", tc.name, got, why, tc.want)
		}
	}
}
