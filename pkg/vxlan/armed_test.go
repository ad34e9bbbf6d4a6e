package vxlan_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// cniAdds is what a CNI does when a peer joins: an FDB entry and a
// neighbour on the device.
func cniAdds(t *testing.T, ns string) {
	t.Helper()
	ipIn(t, ns, "neigh", "add", "198.18.100.77", "lladdr", "02:00:00:00:00:77", "dev", dev, "nud", "permanent")
	if out, err := exec.Command("bridge", "-n", ns, "fdb", "append", "02:00:00:00:00:77", "dev", dev, "dst", "198.18.0.77").CombinedOutput(); err != nil {
		t.Fatalf("bridge fdb append: %v\n%s", err, out)
	}
}

func hasLatePeer(s vxlan.Snapshot) (fdb, neigh bool) {
	for _, e := range s.FDB {
		fdb = fdb || (e.MAC == "02:00:00:00:00:77" && e.Dst.String() == "198.18.0.77")
	}
	for _, n := range s.Neighbors {
		neigh = neigh || n.IP.String() == "198.18.100.77"
	}
	return fdb, neigh
}

// TestArmedUnchanged: read ahead (Arm), nothing changes, and
// RecreateArmed adopts the prebuilt device without reading the device
// again: the result is the device as read, on the new port, and traffic
// flows once both sides moved.
func TestArmedUnchanged(t *testing.T) {
	a, b := newLab(t, 4789)
	for _, n := range []*node{a, b} {
		before, armed := prebuildAndArm(t, n.Kernel)
		if armed.Snap.Text() != before.Text() {
			t.Fatalf("%s: armed read\n%s\nwant\n%s", n.NS, armed.Snap.Text(), before.Text())
		}
		w, err := n.Kernel.RecreateArmed(armed)
		if err != nil {
			t.Fatal(err)
		}
		if !w.Adopted {
			t.Fatalf("%s: the prebuilt device was not adopted: %+v", n.NS, w)
		}
		after, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		want := before
		want.Device.Port = 4889
		if after.Text() != want.Text() {
			t.Fatalf("%s after RecreateArmed:\n%s\nwant:\n%s", n.NS, after.Text(), want.Text())
		}
		if err := n.Kernel.Cleanup(dev); err != nil {
			t.Fatal(err)
		}
		checkPorts(t, n.NS, 4789, 4889)
	}
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("after both moved: paths %q, want %q", got, allPaths)
	}
}

// TestArmedWatchSeesCNI: the CNI adds a peer's FDB entry and neighbour
// after the early read and before the instant. RecreateArmed refuses
// (ErrChanged) and touches nothing; the caller's fresh read then carries
// the entries over.
func TestArmedWatchSeesCNI(t *testing.T) {
	for _, what := range []string{"fdb and neighbour", "route", "address"} {
		t.Run(strings.ReplaceAll(what, " ", "_"), func(t *testing.T) {
			a, _ := newLab(t, 4789)
			snap, armed := prebuildAndArm(t, a.Kernel)
			switch what {
			case "fdb and neighbour":
				cniAdds(t, a.NS)
			case "route":
				ipIn(t, a.NS, "route", "add", "198.18.102.0/24", "dev", dev)
			case "address":
				ipIn(t, a.NS, "addr", "add", "198.18.103.1/32", "dev", dev)
			}
			if _, err := a.Kernel.RecreateArmed(armed); !vxlan.IsChanged(err) {
				t.Fatalf("RecreateArmed after the CNI's %s: %v, want ErrChanged", what, err)
			}
			now, err := a.Kernel.Snapshot(dev)
			if err != nil {
				t.Fatal(err)
			}
			if now.Device.Port != 4789 || now.Device.Index != snap.Device.Index {
				t.Fatalf("the device was touched: %s", now.Text())
			}
			// The caller's fallback: a fresh read, Recreate.
			if _, err := a.Kernel.Recreate(now, 4889); err != nil {
				t.Fatal(err)
			}
			after, err := a.Kernel.Snapshot(dev)
			if err != nil {
				t.Fatal(err)
			}
			want := now
			want.Device.Port = 4889
			if after.Text() != want.Text() {
				t.Fatalf("after the fresh recreate:\n%s\nwant:\n%s", after.Text(), want.Text())
			}
		})
	}
}

// TestArmedWatchBites: with its watch ignored, RecreateArmed builds the
// device as read ahead and the peer the CNI added in between is lost —
// what TestArmedWatchSeesCNI must catch.
func TestArmedWatchBites(t *testing.T) {
	a, _ := newLab(t, 4789)
	vxlan.BlindWatch(a.Kernel)
	_, armed := prebuildAndArm(t, a.Kernel)
	cniAdds(t, a.NS)
	if _, err := a.Kernel.RecreateArmed(armed); err != nil {
		t.Fatalf("blind RecreateArmed: %v", err)
	}
	after, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if fdb, neigh := hasLatePeer(after); fdb || neigh || after.Device.Port != 4889 {
		t.Fatalf("blind, the late peer survived (fdb %v, neighbour %v): the watch test would pass without its guard: %s", fdb, neigh, after.Text())
	}
}

// TestArmedClosed: an Armed that was closed (its watch gone) refuses;
// Arm with its context done does not read.
func TestArmedClosed(t *testing.T) {
	a, _ := newLab(t, 4789)
	armed, err := a.Kernel.Arm(context.Background(), dev, 4889)
	if err != nil {
		t.Fatal(err)
	}
	armed.Close()
	if _, err := a.Kernel.RecreateArmed(armed); !vxlan.IsChanged(err) {
		t.Fatalf("RecreateArmed on a closed Armed: %v, want ErrChanged", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Kernel.Arm(ctx, dev, 4889); err == nil {
		t.Fatal("Arm with its context done: no error")
	}
}

// prebuildAndArm does what the agent does before the commit instant:
// reads dev (the snapshot it returns), prebuilds its device on 4889, and
// reads ahead under the watch (Arm).
func prebuildAndArm(t *testing.T, k *vxlan.Kernel) (vxlan.Snapshot, *vxlan.Armed) {
	t.Helper()
	snap, err := k.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Prebuild(snap, 4889); err != nil {
		t.Fatal(err)
	}
	armed, err := k.Arm(context.Background(), dev, 4889)
	if err != nil {
		t.Fatal(err)
	}
	return snap, armed
}
