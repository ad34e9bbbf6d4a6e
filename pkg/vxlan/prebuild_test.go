package vxlan_test

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

func ipIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPrebuildThenRecreateAdopts: a device prebuilt for the port holds no
// port and carries no address; Recreate on that port adopts it, and the
// result is the device as read just before (not as prebuilt): an FDB entry
// and a neighbour the CNI added in between, and one it removed, are
// accounted for. Traffic flows again once both sides moved.
func TestPrebuildThenRecreateAdopts(t *testing.T) {
	a, b := newLab(t, 4789)
	for _, n := range []*node{a, b} {
		snap, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Kernel.Prebuild(snap, 4889); err != nil {
			t.Fatal(err)
		}
		// Prebuilt: down, no addresses, and port 4889 still free.
		tmp := ipIn(t, n.NS, "-o", "link", "show", "type", "vxlan")
		var line string
		for _, l := range strings.Split(tmp, "\n") {
			if strings.Contains(l, ": cotx") {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, "state DOWN") {
			t.Fatalf("%s: no prebuilt device, down, in %q", n.NS, tmp)
		}
		if addrs := ipIn(t, n.NS, "-o", "addr", "show", "dev", strings.Fields(line)[1][:len(strings.Fields(line)[1])-1]); strings.Contains(addrs, "inet") {
			t.Fatalf("%s: the prebuilt device has addresses: %s", n.NS, addrs)
		}
		c, err := udpport.Open(n.NS)
		if err != nil {
			t.Fatal(err)
		}
		// udpport names a down vxlan device configured with the port as
		// its holder (it takes the port when it comes up); no socket may
		// have it yet.
		free, h, err := c.Free(4889)
		c.H.Close()
		if err != nil || free || h.Kind != "vxlan" || !strings.HasPrefix(h.Device, "cotx") {
			t.Fatalf("%s: port 4889 after Prebuild: free=%v holder=%v err=%v; want only the prebuilt (down) device named", n.NS, free, h, err)
		}
		// A replayed Prepare keeps the same device.
		if _, err := n.Kernel.Prebuild(snap, 4889); err != nil {
			t.Fatal(err)
		}
	}
	// The CNI changes a's device between Prepare and Commit.
	ipIn(t, a.NS, "neigh", "add", "198.18.100.77", "lladdr", "02:00:00:00:00:77", "dev", dev, "nud", "permanent")
	if out, err := exec.Command("bridge", "-n", a.NS, "fdb", "add", "02:00:00:00:00:77", "dev", dev, "dst", "198.18.0.77").CombinedOutput(); err != nil {
		t.Fatalf("bridge fdb add: %v\n%s", err, out)
	}
	for _, n := range []*node{a, b} {
		before, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		w, err := n.Kernel.Recreate(before, 4889)
		if err != nil {
			t.Fatal(err)
		}
		if !w.Adopted {
			t.Fatalf("%s: Recreate did not adopt the prebuilt device (window %+v)", n.NS, w)
		}
		after, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		want := before
		want.Device.Port = 4889
		if after.Text() != want.Text() {
			t.Fatalf("%s after adopting:\n%s\nwant (all equal but the port):\n%s", n.NS, after.Text(), want.Text())
		}
		if n == a && (len(after.FDB) != 3 || len(after.Neighbors) != 2) {
			t.Fatalf("a: the CNI's additions between Prebuild and Recreate are missing: %s", after.Text())
		}
		if err := n.Kernel.Cleanup(dev); err != nil {
			t.Fatal(err)
		}
		checkPorts(t, n.NS, 4789, 4889)
	}
	if got := vxlantest.Connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("after both adopted: paths %q, want %q", got, allPaths)
	}
}

// TestPrebuildTopUpRemovals: what the CNI removed between Prebuild and
// Recreate is removed from the adopted device too.
func TestPrebuildTopUpRemovals(t *testing.T) {
	a, _ := newLab(t, 4789)
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Prebuild(snap, 4889); err != nil {
		t.Fatal(err)
	}
	if len(snap.Neighbors) == 0 {
		t.Fatalf("lab has no neighbour to remove: %s", snap.Text())
	}
	ipIn(t, a.NS, "neigh", "del", snap.Neighbors[0].IP.String(), "dev", dev)
	before, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	w, err := a.Kernel.Recreate(before, 4889)
	if err != nil || !w.Adopted {
		t.Fatalf("Recreate: %+v, %v; want adopted", w, err)
	}
	after, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	want := before
	want.Device.Port = 4889
	if after.Text() != want.Text() {
		t.Fatalf("after adopting:\n%s\nwant:\n%s", after.Text(), want.Text())
	}
}

// TestPrebuildOtherPortNotAdopted: a device prebuilt for another port (a
// revert to the old port, say) is replaced, not adopted; Cleanup removes
// one that is never used.
func TestPrebuildOtherPortNotAdopted(t *testing.T) {
	a, _ := newLab(t, 4789)
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Prebuild(snap, 4999); err != nil {
		t.Fatal(err)
	}
	w, err := a.Kernel.Recreate(snap, 4889)
	if err != nil || w.Adopted {
		t.Fatalf("Recreate to 4889 with a device prebuilt for 4999: %+v, %v; want built afresh", w, err)
	}
	if got, _ := a.Kernel.Snapshot(dev); got.Device.Port != 4889 {
		t.Fatalf("port %d, want 4889", got.Device.Port)
	}
	// Prebuild again, then Cleanup: no device of ours is left.
	snap, err = a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Prebuild(snap, 4789); err != nil {
		t.Fatal(err)
	}
	if err := a.Kernel.Cleanup(dev); err != nil {
		t.Fatal(err)
	}
	links := ipIn(t, a.NS, "-o", "link", "show")
	for _, prefix := range []string{"cotx", "cotd"} {
		if strings.Contains(links, prefix) {
			t.Fatalf("a %s device survived Cleanup:\n%s", prefix, links)
		}
	}
	if _, err := net.ParseMAC(snap.Device.MAC); err != nil {
		t.Fatal(err)
	}
}

// TestPrebuildBadInput names the field and changes nothing.
func TestPrebuildBadInput(t *testing.T) {
	a, _ := newLab(t, 4789)
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	before := ipIn(t, a.NS, "-o", "link", "show")
	for _, port := range []int{0, 70000} {
		_, err := a.Kernel.Prebuild(snap, port)
		if err == nil || !strings.Contains(err.Error(), "newPort") {
			t.Fatalf("Prebuild(port %d): %v; want an error naming newPort", port, err)
		}
	}
	if after := ipIn(t, a.NS, "-o", "link", "show"); after != before {
		t.Fatalf("links changed on bad input:\n%s\nvs\n%s", before, after)
	}
	var _ vxlan.Interface = a.Kernel
}

// TestTopUpBites: adopted without its top-up, the device lacks what the CNI
// added between Prebuild and Recreate — what TestPrebuildThenRecreateAdopts
// must catch.
func TestTopUpBites(t *testing.T) {
	a, _ := newLab(t, 4789)
	vxlan.SkipTopUp(a.Kernel)
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Prebuild(snap, 4889); err != nil {
		t.Fatal(err)
	}
	ipIn(t, a.NS, "neigh", "add", "198.18.100.77", "lladdr", "02:00:00:00:00:77", "dev", dev, "nud", "permanent")
	before, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if w, err := a.Kernel.Recreate(before, 4889); err != nil || !w.Adopted {
		t.Fatalf("Recreate: %+v, %v; want adopted", w, err)
	}
	after, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Neighbors) == len(before.Neighbors) {
		t.Fatalf("without the top-up the CNI's neighbour is still there (%s): the adoption test would pass without its guard", after.Text())
	}
}
