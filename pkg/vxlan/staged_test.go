package vxlan_test

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// stream is UDP traffic every interval from one node's namespace to
// another's overlay address, echoed back. Each datagram carries its
// sequence number; lostIn counts those sent in a time range that never
// came back. Sockets are made in their namespaces; the goroutines need
// not be.
type stream struct {
	mu       sync.Mutex
	sentAt   []time.Time // by sequence number
	answered map[uint64]bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startStream(t *testing.T, from, to *node, interval time.Duration) *stream {
	t.Helper()
	return streamTo(t, from, to, to.Overlay, interval)
}

// streamTo is startStream to one of to's addresses.
func streamTo(t *testing.T, from, to *node, addr string, interval time.Duration) *stream {
	t.Helper()
	var echo, tx *net.UDPConn
	if err := netns.Do(to.NS, func() error {
		var err error
		echo, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(addr), Port: 9100})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(from.NS, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addr), Port: 9100})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s := &stream{stop: make(chan struct{}), answered: map[uint64]bool{}}
	s.wg.Add(3)
	go func() { // echo
		defer s.wg.Done()
		buf := make([]byte, 64)
		for {
			n, addr, err := echo.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = echo.WriteToUDP(buf[:n], addr)
		}
	}()
	go func() { // answers
		defer s.wg.Done()
		buf := make([]byte, 64)
		for {
			n, err := tx.Read(buf)
			if err != nil {
				return
			}
			if n == 8 {
				s.mu.Lock()
				s.answered[binary.BigEndian.Uint64(buf)] = true
				s.mu.Unlock()
			}
		}
	}()
	go func() { // sender
		defer s.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		var b [8]byte
		for {
			select {
			case <-s.stop:
				time.Sleep(200 * time.Millisecond) // the last answers
				_ = tx.Close()
				_ = echo.Close()
				return
			case <-tick.C:
				s.mu.Lock()
				seq := uint64(len(s.sentAt))
				s.sentAt = append(s.sentAt, time.Now())
				s.mu.Unlock()
				binary.BigEndian.PutUint64(b[:], seq)
				_, _ = tx.Write(b[:])
			}
		}
	}()
	return s
}

// lostIn counts the datagrams sent in [from, to) never answered; call it
// once they had 200 ms to come back.
func (s *stream) lostIn(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for seq, at := range s.sentAt {
		if !at.Before(from) && at.Before(to) && !s.answered[uint64(seq)] {
			n++
		}
	}
	return n
}

func (s *stream) close() { close(s.stop); s.wg.Wait() }

// TestStagedKernelPhases runs the staged strategy's kernel steps on two
// namespaces with traffic every millisecond both ways: both listen on the
// new port (a receiver on it), each switches its egress (per-FDB-entry
// port), both retire (the receiver adopted as the device while it keeps
// receiving). Listening and switching lose nothing; the retirement's loss
// is bounded and logged. The end state is the device on the new port, as
// a Recreate leaves it, with no receiver left.
func TestStagedKernelPhases(t *testing.T) {
	a, b := newLab(t, 4789)
	before := snapshots(t, a, b)
	ab, ba := startStream(t, a, b, time.Millisecond), startStream(t, b, a, time.Millisecond)
	defer ab.close()
	defer ba.close()
	time.Sleep(300 * time.Millisecond)
	phase := func(name string, bound int, f func()) {
		t.Helper()
		t0 := time.Now()
		f()
		time.Sleep(50 * time.Millisecond)
		t1 := time.Now()
		time.Sleep(250 * time.Millisecond) // the answers
		for i, st := range []*stream{ab, ba} {
			dir := []string{"a→b", "b→a"}[i]
			lost := st.lostIn(t0, t1)
			t.Logf("%s: %s lost %d", name, dir, lost)
			if lost > bound {
				t.Errorf("%s: %s lost %d datagrams at 1 ms, bound %d", name, dir, lost, bound)
			}
		}
	}
	phase("listen", 0, func() {
		for _, n := range []*node{a, b} {
			if err := n.Kernel.Listen(before[n], 4889); err != nil {
				t.Fatal(err)
			}
			// A replay changes nothing.
			if err := n.Kernel.Listen(before[n], 4889); err != nil {
				t.Fatal(err)
			}
			if rp, all, err := n.Kernel.ReversePathFilter(vxlan.TmpName(dev)); err != nil || rp != 0 || all != 0 {
				t.Fatalf("%s receiver rp_filter %d all %d: %v", n.NS, rp, all, err)
			}
		}
	})
	phase("switch", 0, func() {
		for _, n := range []*node{a, b} {
			if err := n.Kernel.SetFDBPorts(before[n], 4889); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // one node at a time
		}
	})
	phase("retire", 2, func() {
		for _, n := range []*node{a, b} {
			retire(t, n)
		}
	})
	for _, n := range []*node{a, b} {
		checkRetired(t, n, before[n])
		if links := ipIn(t, n.NS, "-o", "link", "show", "type", "vxlan"); strings.Count(links, "\n") != 1 {
			t.Errorf("%s: VXLAN links after retire:\n%s", n.NS, links)
		}
	}
}

// TestStagedKernelUnlisten: Listen then Cleanup leaves the namespace as it
// was: the device, its FDB, neighbours and routes, and no other link.
func TestStagedKernelUnlisten(t *testing.T) {
	a, _ := newLab(t, 4789)
	s, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	links := ipIn(t, a.NS, "-o", "link", "show")
	if err := a.Kernel.Listen(s, 4889); err != nil {
		t.Fatal(err)
	}
	if l := ipIn(t, a.NS, "-o", "link", "show"); !strings.Contains(l, vxlan.TmpName(dev)) || !strings.Contains(l, "state UNKNOWN") && !strings.Contains(l, ",UP") {
		t.Fatalf("no receiver up after Listen:\n%s", l)
	}
	if err := a.Kernel.Cleanup(dev); err != nil {
		t.Fatal(err)
	}
	after, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if after.Text() != s.Text() {
		t.Errorf("device after Listen+Cleanup:\n%s\nwant\n%s", after.Text(), s.Text())
	}
	if l := ipIn(t, a.NS, "-o", "link", "show"); stripCounters(l) != stripCounters(links) {
		t.Errorf("links after Listen+Cleanup:\n%s\nwant\n%s", l, links)
	}
}

// snapshots reads each node's device.
func snapshots(t *testing.T, nodes ...*node) map[*node]vxlan.Snapshot {
	t.Helper()
	out := map[*node]vxlan.Snapshot{}
	for _, n := range nodes {
		s, err := n.Kernel.Snapshot(dev)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = s
	}
	return out
}

// retire is the staged retirement of n's device to 4889 (the receiver
// adopted while it receives), then the old device's removal.
func retire(t *testing.T, n *node) {
	t.Helper()
	live, err := n.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	for i := range live.FDB {
		if live.FDB[i].Port == 4889 {
			live.FDB[i].Port = 0 // the new device's own port
		}
	}
	if w, err := n.Kernel.Recreate(live, 4889); err != nil || !w.Adopted {
		t.Fatalf("%s: retire: %+v %v; want the receiver adopted", n.NS, w, err)
	}
	if err := n.Kernel.Cleanup(dev); err != nil {
		t.Fatal(err)
	}
}

// checkRetired: n's device is before's on port 4889.
func checkRetired(t *testing.T, n *node, before vxlan.Snapshot) {
	t.Helper()
	after, err := n.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	want := before
	want.Device.Port = 4889
	if got := strings.TrimSpace(after.Text()); got != strings.TrimSpace(want.Text()) {
		t.Errorf("%s after retire:\n%s\nwant:\n%s", n.NS, got, want.Text())
	}
}

// stripCounters keeps each link's index and name.
func stripCounters(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 {
			out = append(out, f[0]+f[1])
		}
	}
	return strings.Join(out, " ")
}

// TestStagedRPFilterBites: with loose reverse-path filtering left on the
// receiver, what a peer sends to the new port is dropped after it
// switches — what TestStagedKernelPhases' switch phase must catch.
func TestStagedRPFilterBites(t *testing.T) {
	a, b := newLab(t, 4789)
	vxlan.LooseRPFilter(b.Kernel)
	sa, err := a.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Kernel.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Kernel.Listen(sb, 4889); err != nil {
		t.Fatal(err)
	}
	ab := startStream(t, a, b, time.Millisecond)
	defer ab.close()
	time.Sleep(200 * time.Millisecond)
	if err := a.Kernel.SetFDBPorts(sa, 4889); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(200 * time.Millisecond)
	t1 := time.Now()
	time.Sleep(250 * time.Millisecond)
	if lost := ab.lostIn(t0, t1); lost < 100 {
		t.Fatalf("with loose rp_filter on the receiver a→b lost %d of ~200 after the switch: the guard test would pass without its guard", lost)
	}
}

// flannelLayout gives both nodes flannel's layout: the device holds a /32
// (no connected subnet), the peer's device address has a permanent
// neighbour entry, and it and the subnet behind it are reached by onlink
// routes through the device.
func flannelLayout(t *testing.T, a, b *node) {
	t.Helper()
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		self, peer := p[0], p[1]
		mac := strings.TrimSpace(vxlantest.Run(t, peer.NS, "cat /sys/class/net/"+dev+"/address"))
		// Deleting the device's last address flushes its neighbours too.
		vxlantest.Run(t, self.NS, "ip addr del "+self.Overlay+"/24 dev "+dev)
		vxlantest.Run(t, self.NS, "ip addr add "+self.Overlay+"/32 dev "+dev)
		vxlantest.Run(t, self.NS, "ip neigh replace "+peer.Overlay+" lladdr "+mac+" dev "+dev+" nud permanent")
		vxlantest.Run(t, self.NS, "ip route replace "+peer.Overlay+"/32 via "+peer.Overlay+" dev "+dev+" onlink")
		vxlantest.Run(t, self.NS, "ip route replace 198.18.101.0/24 via "+peer.Overlay+" dev "+dev+" onlink")
	}
}

// retirePaused runs the staged phases on flannel's layout with traffic
// every millisecond both ways to the subnet behind each node, then retires
// a and b with the agent paused 50 ms after every change the switch makes
// (as a preempted agent on a loaded node would be). It returns what was
// lost in the retirement each way, and the steps.
func retirePaused(t *testing.T, bite bool) (lost [2]int, steps []string) {
	t.Helper()
	a, b := newLab(t, 4789)
	flannelLayout(t, a, b)
	snaps := snapshots(t, a, b)
	ab, ba := streamTo(t, a, b, b.Loopback, time.Millisecond), streamTo(t, b, a, a.Loopback, time.Millisecond)
	defer ab.close()
	defer ba.close()
	for _, n := range []*node{a, b} {
		if err := n.Kernel.Listen(snaps[n], 4889); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*node{a, b} {
		if err := n.Kernel.SetFDBPorts(snaps[n], 4889); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	for _, n := range []*node{a, b} {
		if bite {
			vxlan.AddrsFirst(n.Kernel)
		}
		vxlan.PauseEachStep(n.Kernel, func(s string) {
			steps = append(steps, n.NS+": "+s)
			time.Sleep(50 * time.Millisecond)
		})
		retire(t, n)
	}
	t1 := time.Now()
	time.Sleep(250 * time.Millisecond) // the answers
	for _, n := range []*node{a, b} {
		checkRetired(t, n, snaps[n])
	}
	return [2]int{ab.lostIn(t0, t1), ba.lostIn(t0, t1)}, steps
}

// TestRetireEveryStepForwards: the staged retirement forwards in every
// state it passes through, so an agent paused between any two of its
// changes costs nothing. With flannel's layout the routes move to the
// adopted receiver before the old device loses its address: losing its
// last IPv4 address flushes every route through it.
func TestRetireEveryStepForwards(t *testing.T) {
	lost, steps := retirePaused(t, false)
	t.Logf("steps, 50 ms apart: %s", strings.Join(steps, "; "))
	if len(steps) < 8 {
		t.Fatalf("%d steps paused at, want at least 4 per node: the pauses did not happen", len(steps))
	}
	if lost != [2]int{} {
		t.Errorf("retirement with 50 ms between steps lost a→b %d, b→a %d datagrams at 1 ms; want 0", lost[0], lost[1])
	}
}

// TestRetireEveryStepForwardsBites: with the old device stripped of its
// address before the routes move (the order before the fix), the pauses
// cost the subnet behind the node its route: what the test above must
// catch.
func TestRetireEveryStepForwardsBites(t *testing.T) {
	lost, steps := retirePaused(t, true)
	t.Logf("steps, 50 ms apart: %s; lost a→b %d, b→a %d", strings.Join(steps, "; "), lost[0], lost[1])
	if lost[0]+lost[1] < 40 {
		t.Fatalf("addresses first lost %v at 1 ms with 50 ms pauses; want a gap of tens: the guard test would pass without its guard", lost)
	}
}
