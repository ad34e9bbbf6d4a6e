package vxlan_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// TestKeepOldThenCleanup: with KeepOld the old device stays, renamed, on the
// old port while traffic already flows on the new one; Cleanup removes it
// (twice is harmless); a reverse Recreate clears a leftover old device
// itself before building on that port.
func TestKeepOldThenCleanup(t *testing.T) {
	a, b := newLab(t, 4789)
	for _, n := range []*node{a, b} {
		n.Kernel.KeepOld = true
		snap, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Kernel.Recreate(snap, 4889); err != nil {
			t.Fatal(err)
		}
	}
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("both on 4889 with the old devices kept: paths %q, want %q", got, allPaths)
	}
	holder := func(n *node, port int) udpport.Holder {
		t.Helper()
		c, err := udpport.Open(n.NS)
		if err != nil {
			t.Fatal(err)
		}
		defer c.H.Close()
		_, h, err := c.Free(uint16(port))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if h := holder(a, 4789); h.Device != vxlan.OldName(dev) {
		t.Fatalf("old port 4789 held by %+v, want the kept old device %s", h, vxlan.OldName(dev))
	}
	// b goes back to 4789 with its old device still there: Recreate must
	// clear it first.
	snap, err := b.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Kernel.Recreate(snap, 4789); err != nil {
		t.Fatalf("reverse Recreate over a kept old device: %v", err)
	}
	if h := holder(b, 4789); h.Device != dev {
		t.Fatalf("b: 4789 held by %+v, want %s", h, dev)
	}
	for i := 0; i < 2; i++ {
		if err := a.Kernel.Cleanup(dev); err != nil {
			t.Fatalf("Cleanup #%d: %v", i+1, err)
		}
	}
	if h := holder(a, 4789); h.Kind != "" {
		t.Fatalf("after Cleanup 4789 still held by %+v", h)
	}
	if got := vxlantest.Run(t, a.NS, "ip -o link show"); strings.Contains(got, vxlan.OldName(dev)) {
		t.Fatalf("old device still listed after Cleanup:\n%s", got)
	}
}
