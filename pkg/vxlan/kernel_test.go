package vxlan_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

const (
	allPaths = vxlantest.AllPaths
	noPaths  = "- - - -"
)

// TestRecreateMovesPort moves both sides of the lab to 4889 and back, one
// strategy each way, and checks after every step: the snapshot is equal but
// for the port, traffic flows only when both sides agree, and the old port
// is no longer bound.
func TestRecreateMovesPort(t *testing.T) {
	a, b := newLab(t, 4789)
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("lab on 4789: paths %q, want %q", got, allPaths)
	}
	for _, step := range []struct {
		from, to int
		strategy string
	}{
		{4789, 4889, vxlan.StrategyPrebuilt},
		{4889, 4789, vxlan.StrategyDeleteFirst},
	} {
		t.Run(fmt.Sprintf("%s_%d_to_%d", step.strategy, step.from, step.to), func(t *testing.T) {
			for i, n := range []*node{a, b} {
				before, err := n.Kernel.Snapshot(dev)
				if err != nil {
					t.Fatal(err)
				}
				if before.Device.Port != step.from {
					t.Fatalf("%s: port %d before, want %d", n.NS, before.Device.Port, step.from)
				}
				// The snapshot must survive the agent's JSON persistence.
				js, err := json.Marshal(before)
				if err != nil {
					t.Fatal(err)
				}
				var loaded vxlan.Snapshot
				if err := json.Unmarshal(js, &loaded); err != nil {
					t.Fatal(err)
				}
				if loaded.Text() != before.Text() {
					t.Fatalf("JSON round trip changed the snapshot:\n%s\nvs\n%s", loaded.Text(), before.Text())
				}
				n.Kernel.Strategy = step.strategy
				w, err := n.Kernel.Recreate(loaded, step.to)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: %s window: absent %v, total %v, %d calls (prepare %v)", n.NS, w.Strategy, w.Absent, w.Total, w.Calls, w.Prepare)
				after, err := n.Kernel.Snapshot(dev)
				if err != nil {
					t.Fatal(err)
				}
				want := before
				want.Device.Port = step.to
				if after.Text() != want.Text() {
					t.Fatalf("%s after recreate:\n%s\nwant (all equal but the port):\n%s", n.NS, after.Text(), want.Text())
				}
				if len(after.FDB) != 2 || len(after.Neighbors) != 1 || len(after.Routes) != 1 || len(after.Addrs) != 1 {
					t.Fatalf("lab state not fully captured: %s", after.Text())
				}
				checkPorts(t, n.NS, step.from, step.to)
				if i == 0 {
					// Only a has moved: nothing may get through either way.
					if got := vxlantest.Connectivity(t, a, b, 300*time.Millisecond); got != noPaths {
						t.Fatalf("only %s moved to %d: paths %q, want none", n.NS, step.to, got)
					}
				}
			}
			if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
				t.Fatalf("both on %d: paths %q, want %q", step.to, got, allPaths)
			}
		})
	}
}

// checkPorts asserts that in ns the old port is free and the new one is held
// by the device and its kernel socket.
func checkPorts(t *testing.T, ns string, oldPort, newPort int) {
	t.Helper()
	c, err := udpport.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.H.Close()
	if free, h, err := c.Free(uint16(oldPort)); err != nil || !free {
		t.Fatalf("%s: old port %d: free=%v holder=%v err=%v; want free", ns, oldPort, free, h, err)
	}
	if free, h, err := c.Free(uint16(newPort)); err != nil || free || h.Device != dev {
		t.Fatalf("%s: new port %d: free=%v holder=%v err=%v; want held by %s", ns, newPort, free, h, err, dev)
	}
}

// TestRecreateReplay: a replay after success changes nothing; a replay after
// the old device vanished (a crash inside the window) rebuilds it; a leftover
// temporary device is cleared.
func TestRecreateReplay(t *testing.T) {
	a, b := newLab(t, 4789)
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Recreate(snap, 4889); err != nil {
		t.Fatal(err)
	}
	w, err := a.Kernel.Recreate(snap, 4889)
	if err != nil || w.Strategy != "noop" {
		t.Fatalf("replay after success: %+v, %v; want a noop", w, err)
	}
	vxlantest.Run(t, a.NS, "ip link del "+dev)
	vxlantest.Run(t, a.NS, "ip link add cotxleft type veth peer name cotxleft2") // unrelated: must stay
	if _, err := a.Kernel.Recreate(snap, 4889); err != nil {
		t.Fatal(err)
	}
	after, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	want := snap
	want.Device.Port = 4889
	if after.Text() != want.Text() {
		t.Fatalf("rebuilt after loss:\n%s\nwant:\n%s", after.Text(), want.Text())
	}
	if !strings.Contains(vxlantest.Run(t, a.NS, "ip -o link show"), "cotxleft") {
		t.Fatal("an unrelated link was removed")
	}
	_ = b
}

// TestFDBPorts shows what the kernel's per-entry destination port can and
// cannot do: it moves a node's egress towards a peer without touching the
// device, but the device still listens only on its own port.
func TestFDBPorts(t *testing.T) {
	a, b := newLab(t, 4789)
	snapA, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Kernel.SetFDBPorts(snapA, 4889); err != nil {
		t.Fatal(err)
	}
	s, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range s.FDB {
		if e.Port != 4889 {
			t.Fatalf("fdb after SetFDBPorts(4889): %s", s.Text())
		}
	}
	if s.Device.Port != 4789 {
		t.Fatalf("device port changed to %d", s.Device.Port)
	}
	// a sends to 4889, b listens on 4789: a>b dead, b>a alive.
	if got, want := vxlantest.Connectivity(t, a, b, 500*time.Millisecond), "- - b>a:direct b>a:routed"; got != want {
		t.Fatalf("a egress on 4889, b on 4789: paths %q, want %q", got, want)
	}
	snapB, err := b.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Kernel.Recreate(snapB, 4889); err != nil {
		t.Fatal(err)
	}
	// Now b listens on 4889 but sends to 4889 too, where a does not listen.
	if got, want := vxlantest.Connectivity(t, a, b, 500*time.Millisecond), "a>b:direct a>b:routed - -"; got != want {
		t.Fatalf("a egress 4889 ingress 4789, b on 4889: paths %q, want %q", got, want)
	}
	// Back: a's entries to the device port again, b back to 4789.
	if err := a.Kernel.SetFDBPorts(snapA, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Kernel.Recreate(snapB, 4789); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Kernel.Snapshot(dev); err != nil || got.Text() != snapA.Text() {
		t.Fatalf("a after SetFDBPorts(0): %v\n%s\nwant:\n%s", err, got.Text(), snapA.Text())
	}
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("all back on 4789: paths %q", got)
	}
}

func TestTypedErrors(t *testing.T) {
	a, _ := newLab(t, 4789)
	_, err := a.Kernel.Snapshot("nope0")
	if !vxlan.IsNotFound(err) || vxlan.IsNotVXLAN(err) {
		t.Fatalf("Snapshot(nope0) = %v; want IsNotFound", err)
	}
	_, err = a.Kernel.Snapshot("veth0")
	if !vxlan.IsNotVXLAN(err) || vxlan.IsNotFound(err) || !strings.Contains(err.Error(), `"veth"`) {
		t.Fatalf("Snapshot(veth0) = %v; want IsNotVXLAN naming the type", err)
	}
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Recreate(snap, 70000); err == nil || !strings.Contains(err.Error(), "newPort 70000") {
		t.Fatalf("Recreate(70000) = %v; want an error naming newPort", err)
	}
	if err := a.Kernel.SetFDBPorts(snap, -1); err == nil || !strings.Contains(err.Error(), "port -1") {
		t.Fatalf("SetFDBPorts(-1) = %v; want an error naming port", err)
	}
}
