package vxlantest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
)

// TestTopology builds the flannel-shaped variant and checks, in the kernel
// and on the wire, that it is what the tests built on it assume.
func TestTopology(t *testing.T) {
	a, b := vxlantest.New(t, vxlantest.Config{Prefix: "cot-vxt", Device: "flannel.1", VNI: 1, Port: 8472, PinToVeth: true, MTU: 1450, NoIPv6: true})
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != vxlantest.AllPaths {
		t.Fatalf("paths %q, want %q", got, vxlantest.AllPaths)
	}
	for _, n := range []*vxlantest.Node{a, b} {
		s, err := n.Kernel.Snapshot("flannel.1")
		if err != nil {
			t.Fatal(err)
		}
		if s.Device.Port != 8472 || s.Device.VNI != 1 {
			t.Fatalf("%s: device %+v", n.NS, s.Device)
		}
		if l := vxlantest.Run(t, n.NS, "ip -d link show flannel.1"); !strings.Contains(l, "mtu 1450") || !strings.Contains(l, "dev veth0") {
			t.Fatalf("%s: %s", n.NS, l)
		}
		if v := strings.TrimSpace(vxlantest.Run(t, n.NS, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")); v != "1" {
			t.Fatalf("%s: disable_ipv6 %q", n.NS, v)
		}
	}
	// With the underlay cut, no path may carry traffic: the check is real.
	vxlantest.Run(t, b.NS, "ip link set veth0 down")
	if got := vxlantest.Connectivity(t, a, b, 200*time.Millisecond); got != "- - - -" {
		t.Fatalf("with the underlay down: paths %q", got)
	}
}
