package kernelvxlan

// Privileged tests: two fresh network namespaces joined by a veth pair, a
// flannel-shaped kernel VXLAN device in each, real iptables (INPUT drops UDP
// unless a rule in the firewall chain accepts it) and real conntrack. The
// backend is built with Open, as the agent builds it, inside each namespace.

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/nsiptables"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

const (
	labDev   = "flannel.1"
	labChain = "COT-FW"
)

var labTemplate = iptables.Rule{Table: "filter", Chain: labChain, Proto: "udp", StateNew: true, Target: "ACCEPT"}

// node is one side of the two-namespace lab (harness/vxlantest) with the
// backend under test; Node.Kernel is the test's own reader.
type node struct {
	*vxlantest.Node
	b *Backend
}

// run runs a command inside a namespace and fails the test on an error.
var run = vxlantest.Run

// newLab makes two namespaces with flannel.1 on port (VNI 1, nolearning,
// pinned to veth0), the peer in the FDB (flood and unicast), a permanent
// neighbour, a route to 198.18.101.0/24 via the peer, and a firewall where
// only the rules of labChain let UDP in (port already open, as the CNI
// leaves it, and 9999 for an unrelated flow).
func newLab(t testing.TB, port int) (a, b *node) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "bridge", "iptables", "iptables-save", "conntrack", "sysctl")
	// No IPv6: its DAD and router solicitations would cross the overlay on
	// their own and blur the conntrack assertions.
	va, vb := vxlantest.New(t, vxlantest.Config{Prefix: "cot-kvx", Device: labDev, VNI: 1, Port: port, PinToVeth: true, MTU: 1450, NoIPv6: true})
	a, b = &node{Node: va}, &node{Node: vb}
	for _, n := range []*node{a, b} {
		run(t, n.NS, "iptables -N "+labChain)
		run(t, n.NS, "iptables -A INPUT -j "+labChain)
		run(t, n.NS, "iptables -A INPUT -p udp --dport 9999 -j ACCEPT")
		run(t, n.NS, "iptables -A INPUT -i "+labDev+" -j ACCEPT") // the decapsulated probes
		run(t, n.NS, "iptables -A INPUT -p udp -j DROP")
		run(t, n.NS, fmt.Sprintf("iptables -A %s -p udp -m state --state NEW -m udp --dport %d -j ACCEPT", labChain, port))
		var c *iptables.Client
		if err := netns.Do(n.NS, func() error {
			var err error
			c, err = iptables.New(context.Background(), iptables.Config{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		be, closeFn, err := Open(n.NS, Config{Device: labDev,
			Firewall: &dataplane.Firewall{IPT: nsiptables.IPT{NS: n.NS, C: c}, Templates: []iptables.Rule{labTemplate}}}, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeFn)
		n.b = be
	}
	return a, b
}

func (n *node) text(t testing.TB) string {
	t.Helper()
	s, err := n.Kernel.Snapshot(labDev)
	if err != nil {
		t.Fatal(err)
	}
	return s.Text()
}

const allPaths = vxlantest.AllPaths

// connectivity names the overlay paths that carry traffic ("-" for dead).
func connectivity(t testing.TB, a, b *node, wait time.Duration) string {
	t.Helper()
	return vxlantest.Connectivity(t, a.Node, b.Node, wait)
}

var origDport = regexp.MustCompile(`^udp\s.*?dport=(\d+)`)

// udpFlows counts the namespace's UDP conntrack entries by original
// destination port, read with conntrack(8).
func udpFlows(t testing.TB, ns string) map[int]int {
	t.Helper()
	out, err := netns.Command(ns, "conntrack", "-L", "-p", "udp").Output()
	if err != nil {
		t.Fatalf("%s: conntrack -L: %v", ns, err)
	}
	m := map[int]int{}
	for _, l := range strings.Split(string(out), "\n") {
		if s := origDport.FindStringSubmatch(l); s != nil {
			p, _ := strconv.Atoi(s[1])
			m[p]++
		}
	}
	return m
}

// unrelatedFlow makes a UDP conntrack entry to port 9999 on both sides.
func unrelatedFlow(t testing.TB, from, to *node) {
	t.Helper()
	if err := netns.Do(from.NS, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(to.Underlay), Port: 9999})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func hasRule(t testing.TB, ns string, port int) bool {
	t.Helper()
	return strings.Contains(run(t, ns, "iptables-save -t filter"), fmt.Sprintf("-A %s -p udp -m state --state NEW -m udp --dport %d -j ACCEPT", labChain, port))
}

// TestCutoverOnRealKernel drives both nodes through Snapshot, Prepare and
// Commit, a replayed Commit, Revert, then a second operation to Finalize,
// and checks after each step what the kernel, iptables-save and conntrack(8)
// say in each namespace, and which overlay paths carry traffic.
func TestCutoverOnRealKernel(t *testing.T) {
	const oldPort, newPort = 8472, 4889
	ctx := context.Background()
	a, b := newLab(t, oldPort)
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("lab on %d: paths %q", oldPort, got)
	}
	unrelatedFlow(t, a, b)
	unrelatedFlow(t, b, a)
	orig := map[*node]string{a: a.text(t), b: b.text(t)}
	for _, n := range []*node{a, b} {
		if f := udpFlows(t, n.NS); f[oldPort] == 0 || f[9999] == 0 {
			t.Fatalf("%s: no conntrack entries to assert on: %v", n.NS, f)
		}
	}

	snaps := map[*node]dataplane.Snapshot{}
	for _, n := range []*node{a, b} {
		c, err := n.b.Preflight(ctx, newPort)
		if err != nil || len(c.Problems) != 0 || c.CurrentPort != oldPort {
			t.Fatalf("%s preflight: %+v, %v", n.NS, c, err)
		}
		s, err := n.b.Snapshot(ctx, oldPort, newPort)
		if err != nil {
			t.Fatal(err)
		}
		snaps[n] = persist(t, s)
		if err := n.b.Prepare(ctx, snaps[n]); err != nil {
			t.Fatal(err)
		}
		if !hasRule(t, n.NS, newPort) || !hasRule(t, n.NS, oldPort) {
			t.Fatalf("%s after prepare: iptables-save:\n%s", n.NS, run(t, n.NS, "iptables-save -t filter"))
		}
		if n.text(t) != orig[n] {
			t.Fatalf("%s: prepare touched the device", n.NS)
		}
	}

	for i, n := range []*node{a, b} {
		// a is armed ahead of its commit, as the agent does; b is not
		// (a commit that reached its agent too late to arm).
		if n == a {
			if err := n.b.ArmCommit(ctx, snaps[n]); err != nil {
				t.Fatal(err)
			}
		}
		st, err := n.b.Commit(ctx, snaps[n])
		if err != nil {
			t.Fatal(err)
		}
		if wantArmed := map[*node]string{a: "used", b: "no"}[n]; !strings.HasPrefix(st.Detail["armed"], wantArmed) {
			t.Fatalf("%s commit: armed %q, want %s", n.NS, st.Detail["armed"], wantArmed)
		}
		// What the agent does once the commit is answered.
		if _, err := n.b.AfterCommit(ctx, snaps[n]); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s commit: %v", n.NS, st.Detail)
		if st.Port != newPort || st.Detail["vni"] != "1" || st.Detail["strategy"] != vxlan.StrategyPrebuilt {
			t.Fatalf("%s commit state %+v", n.NS, st)
		}
		want := strings.Replace(orig[n], fmt.Sprintf("dstport %d", oldPort), fmt.Sprintf("dstport %d", newPort), 1)
		if got := n.text(t); got != want {
			t.Fatalf("%s after commit:\n%s\nwant (all but the port equal):\n%s", n.NS, got, want)
		}
		if i == 0 {
			if got := connectivity(t, a, b, 300*time.Millisecond); got != "- - - -" {
				t.Fatalf("only a moved: paths %q, want none", got)
			}
		}
	}
	// b flipped last: nothing sent to its old port since its commit. a got
	// b's probes on the old port while only a had moved (as a node does
	// from peers that flip a little later); Finalize deletes those.
	if f := udpFlows(t, b.NS); f[oldPort] != 0 || f[9999] == 0 {
		t.Fatalf("%s after commit: udp conntrack by dport %v: want none for %d, 9999 kept", b.NS, f, oldPort)
	}
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("both on %d: paths %q", newPort, got)
	}
	for _, n := range []*node{a, b} {
		// The new port's rule let the traffic in (INPUT drops other UDP).
		if !regexp.MustCompile(fmt.Sprintf(`\[[1-9]\d*:\d+\] -A %s .*--dport %d `, labChain, newPort)).MatchString(run(t, n.NS, "iptables-save -c -t filter")) {
			t.Fatalf("%s: no packet counted on the %d rule:\n%s", n.NS, newPort, run(t, n.NS, "iptables-save -c -t filter"))
		}
	}

	t.Run("replayed commit is harmless", func(t *testing.T) {
		before := a.text(t)
		idx, _ := a.Kernel.Snapshot(labDev)
		st, err := a.b.Commit(ctx, snaps[a])
		if err != nil || st.Detail["strategy"] != "noop" {
			t.Fatalf("replay: %+v, %v", st, err)
		}
		if _, err := a.b.AfterCommit(ctx, snaps[a]); err != nil {
			t.Fatal(err)
		}
		after, _ := a.Kernel.Snapshot(labDev)
		if a.text(t) != before || after.Device.Index != idx.Device.Index {
			t.Fatal("replayed commit recreated the device")
		}
		if f := udpFlows(t, a.NS); f[oldPort] != 0 || f[9999] == 0 {
			t.Fatalf("after a replayed commit: udp conntrack by dport %v: want none for %d, 9999 kept", f, oldPort)
		}
		if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
			t.Fatalf("after replay: paths %q", got)
		}
	})

	t.Run("revert", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			for rep := 0; rep < 2; rep++ {
				st, err := n.b.Revert(ctx, snaps[n])
				if err != nil || st.Port != oldPort {
					t.Fatalf("%s revert %d: %+v, %v", n.NS, rep, st, err)
				}
			}
			if got := n.text(t); got != orig[n] {
				t.Fatalf("%s after revert:\n%s\nwant the original:\n%s", n.NS, got, orig[n])
			}
			if hasRule(t, n.NS, newPort) || !hasRule(t, n.NS, oldPort) {
				t.Fatalf("%s after revert: iptables-save:\n%s", n.NS, run(t, n.NS, "iptables-save -t filter"))
			}
			if f := udpFlows(t, n.NS); f[newPort] != 0 || f[9999] == 0 {
				t.Fatalf("%s after revert: udp conntrack by dport %v", n.NS, f)
			}
		}
		if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
			t.Fatalf("reverted to %d: paths %q", oldPort, got)
		}
	})

	t.Run("finalize", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			s, err := n.b.Snapshot(ctx, oldPort, newPort)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.b.Prepare(ctx, s); err != nil {
				t.Fatal(err)
			}
			if err := n.b.Finalize(ctx, s); err == nil {
				t.Fatalf("%s: finalize before commit closed the port the device is on", n.NS)
			}
			snaps[n] = s
		}
		for _, n := range []*node{a, b} {
			if _, err := n.b.Commit(ctx, snaps[n]); err != nil {
				t.Fatal(err)
			}
		}
		// A late peer's datagram to the old port.
		if err := netns.Do(b.NS, func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(a.Underlay), Port: oldPort})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("late"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if f := udpFlows(t, a.NS); f[oldPort] == 0 {
			t.Fatalf("late datagram left no entry to assert on: %v", f)
		}
		for _, n := range []*node{a, b} {
			if err := n.b.Finalize(ctx, snaps[n]); err != nil {
				t.Fatal(err)
			}
			if !hasRule(t, n.NS, newPort) || hasRule(t, n.NS, oldPort) {
				t.Fatalf("%s after finalize: iptables-save:\n%s", n.NS, run(t, n.NS, "iptables-save -t filter"))
			}
			if f := udpFlows(t, n.NS); f[oldPort] != 0 || f[9999] == 0 {
				t.Fatalf("%s after finalize: udp conntrack by dport %v", n.NS, f)
			}
			// Commit kept the old device (deleted outside the flip); Finalize removed it.
			if links := run(t, n.NS, "ip -o link show"); strings.Contains(links, vxlan.OldName(labDev)) {
				t.Fatalf("%s after finalize: the old device %s is still there:\n%s", n.NS, vxlan.OldName(labDev), links)
			}
		}
		if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
			t.Fatalf("finalized on %d: paths %q", newPort, got)
		}
	})
}

// TestArmedCommitKeepsLatePeer: the commit is armed (its read done ahead
// of the instant), then the CNI adds a peer's FDB entry and neighbour
// before the instant: the commit notices, reads afresh, and the new
// device has both. The same without a change uses the early read.
// pkg/vxlan's TestArmedWatchBites shows the loss without the watch.
func TestArmedCommitKeepsLatePeer(t *testing.T) {
	const oldPort, newPort = 8472, 4889
	ctx := context.Background()
	a, b := newLab(t, oldPort)
	for _, n := range []*node{a, b} {
		s, err := n.b.Snapshot(ctx, oldPort, newPort)
		if err != nil {
			t.Fatal(err)
		}
		s = persist(t, s)
		if err := n.b.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := n.b.ArmCommit(ctx, s); err != nil {
			t.Fatal(err)
		}
		if n == a {
			run(t, n.NS, "ip neigh add 198.18.101.77 lladdr 02:00:00:00:00:77 dev "+labDev+" nud permanent")
			run(t, n.NS, "bridge fdb append 02:00:00:00:00:77 dev "+labDev+" dst 198.18.0.77")
		}
		before := n.text(t)
		st, err := n.b.Commit(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s commit: %v", n.NS, st.Detail)
		want := strings.Replace(before, fmt.Sprintf("dstport %d", oldPort), fmt.Sprintf("dstport %d", newPort), 1)
		if got := n.text(t); got != want {
			t.Fatalf("%s after commit:\n%s\nwant (all but the port equal):\n%s", n.NS, got, want)
		}
		wantArmed := map[*node]string{a: "stale", b: "used"}[n]
		if !strings.HasPrefix(st.Detail["armed"], wantArmed) || st.Port != newPort {
			t.Fatalf("%s commit: port %d, armed %q; want %d, %s", n.NS, st.Port, st.Detail["armed"], newPort, wantArmed)
		}
		if n == a && (!strings.Contains(want, "198.18.101.77") || !strings.Contains(want, "dst 198.18.0.77")) {
			t.Fatalf("the late peer is not in the device before the commit either:\n%s", before)
		}
	}
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("both on %d: paths %q", newPort, got)
	}
}

// TestRevertAfterCrashInWindow: the agent died inside the window, leaving
// no device under the name; a fresh backend's Revert rebuilds it from the
// persisted snapshot and the overlay works again.
func TestRevertAfterCrashInWindow(t *testing.T) {
	ctx := context.Background()
	a, b := newLab(t, 8472)
	orig := a.text(t)
	s, err := a.b.Snapshot(ctx, 8472, 4889)
	if err != nil {
		t.Fatal(err)
	}
	s = persist(t, s)
	if err := a.b.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	run(t, a.NS, "ip link del "+labDev)
	fresh, closeFn, err := Open(a.NS, Config{Device: labDev, Firewall: a.b.cfg.Firewall}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	st, err := fresh.Revert(ctx, s)
	if err != nil || st.Port != 8472 {
		t.Fatalf("revert after a crash: %+v, %v", st, err)
	}
	if got := a.text(t); got != orig {
		t.Fatalf("rebuilt:\n%s\nwant:\n%s", got, orig)
	}
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("after rebuild: paths %q", got)
	}
}
