package kernelvxlan

// Privileged tests: two fresh network namespaces joined by a veth pair, a
// flannel-shaped kernel VXLAN device in each, real iptables (INPUT drops UDP
// unless a rule in the firewall chain accepts it) and real conntrack. The
// backend is built with Open, as the agent builds it, inside each namespace.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/testenv"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

const (
	labDev   = "flannel.1"
	labChain = "COT-FW"
)

var labTemplate = iptables.Rule{Table: "filter", Chain: labChain, Proto: "udp", StateNew: true, Target: "ACCEPT"}

type node struct {
	ns       string
	underlay string
	overlay  string
	loopback string // on lo, reached through the route via the peer
	b        *Backend
	vx       *vxlan.Kernel // the test's own reader
}

// nsIPT runs every iptables call on a thread inside the namespace: the
// Client execs the binaries, which inherit the calling thread's namespace.
type nsIPT struct {
	ns string
	c  *iptables.Client
}

func (n nsIPT) do(fn func() error) error { return netns.Do(n.ns, fn) }
func (n nsIPT) EnsureChain(table, chain string) error {
	return n.do(func() error { return n.c.EnsureChain(table, chain) })
}
func (n nsIPT) EnsureRule(r iptables.Rule) error {
	return n.do(func() error { return n.c.EnsureRule(r) })
}
func (n nsIPT) DeleteRule(r iptables.Rule) error {
	return n.do(func() error { return n.c.DeleteRule(r) })
}
func (n nsIPT) HasRule(r iptables.Rule) (ok bool, err error) {
	err = n.do(func() error { ok, err = n.c.HasRule(r); return err })
	return ok, err
}
func (n nsIPT) ListRules(table, chain string) (out []string, err error) {
	err = n.do(func() error { out, err = n.c.ListRules(table, chain); return err })
	return out, err
}
func (n nsIPT) EnsureJump(table, from, to string) error {
	return n.do(func() error { return n.c.EnsureJump(table, from, to) })
}
func (n nsIPT) Backend() string { return n.c.Backend() }

func run(t testing.TB, ns, cmd string) string {
	t.Helper()
	out, err := netns.Command(ns, strings.Fields(cmd)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s: %v: %s", ns, cmd, err, out)
	}
	return string(out)
}

// newLab makes two namespaces with flannel.1 on port (VNI 1, nolearning,
// pinned to veth0), the peer in the FDB (flood and unicast), a permanent
// neighbour, a route to 198.18.101.0/24 via the peer, and a firewall where
// only the rules of labChain let UDP in (port already open, as the CNI
// leaves it, and 9999 for an unrelated flow).
func newLab(t testing.TB, port int) (a, b *node) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "bridge", "iptables", "iptables-save", "conntrack", "sysctl")
	id := rand.Uint32()
	a = &node{ns: fmt.Sprintf("cot-kvx-%08x-a", id), underlay: "198.18.0.1", overlay: "198.18.100.1", loopback: "198.18.101.2"}
	b = &node{ns: fmt.Sprintf("cot-kvx-%08x-b", id), underlay: "198.18.0.2", overlay: "198.18.100.2", loopback: "198.18.101.1"}
	for _, n := range []*node{a, b} {
		if err := netns.Create(n.ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.Delete(n.ns) })
		// No IPv6: its DAD and router solicitations would cross the
		// overlay on their own and blur the conntrack assertions.
		run(t, n.ns, "sysctl -q -w net.ipv6.conf.all.disable_ipv6=1")
		run(t, n.ns, "sysctl -q -w net.ipv6.conf.default.disable_ipv6=1")
	}
	run(t, a.ns, "ip link add veth0 type veth peer name veth0 netns "+b.ns)
	for _, n := range []*node{a, b} {
		run(t, n.ns, "ip addr add "+n.underlay+"/24 dev veth0")
		run(t, n.ns, "ip link set veth0 up")
		run(t, n.ns, fmt.Sprintf("ip link add %s type vxlan id 1 dstport %d local %s dev veth0 nolearning", labDev, port, n.underlay))
		run(t, n.ns, "ip link set "+labDev+" mtu 1450")
		run(t, n.ns, "ip addr add "+n.overlay+"/24 dev "+labDev)
		run(t, n.ns, "ip addr add "+n.loopback+"/32 dev lo")
		run(t, n.ns, "ip link set "+labDev+" up")
		run(t, n.ns, "iptables -N "+labChain)
		run(t, n.ns, "iptables -A INPUT -j "+labChain)
		run(t, n.ns, "iptables -A INPUT -p udp --dport 9999 -j ACCEPT")
		run(t, n.ns, "iptables -A INPUT -i "+labDev+" -j ACCEPT") // the decapsulated probes
		run(t, n.ns, "iptables -A INPUT -p udp -j DROP")
		run(t, n.ns, fmt.Sprintf("iptables -A %s -p udp -m state --state NEW -m udp --dport %d -j ACCEPT", labChain, port))
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		self, peer := p[0], p[1]
		mac := strings.Fields(run(t, peer.ns, "cat /sys/class/net/"+labDev+"/address"))[0]
		run(t, self.ns, "bridge fdb append 00:00:00:00:00:00 dev "+labDev+" dst "+peer.underlay)
		run(t, self.ns, "bridge fdb append "+mac+" dev "+labDev+" dst "+peer.underlay)
		run(t, self.ns, "ip neigh replace "+peer.overlay+" lladdr "+mac+" dev "+labDev+" nud permanent")
		run(t, self.ns, "ip route add 198.18.101.0/24 via "+peer.overlay+" dev "+labDev)
	}
	for _, n := range []*node{a, b} {
		var c *iptables.Client
		if err := netns.Do(n.ns, func() error {
			var err error
			c, err = iptables.New(context.Background(), iptables.Config{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		be, closeFn, err := Open(n.ns, Config{Device: labDev,
			Firewall: &dataplane.Firewall{IPT: nsIPT{ns: n.ns, c: c}, Templates: []iptables.Rule{labTemplate}}}, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeFn)
		n.b = be
		k, err := vxlan.Open(n.ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		n.vx = k
	}
	return a, b
}

func (n *node) text(t testing.TB) string {
	t.Helper()
	s, err := n.vx.Snapshot(labDev)
	if err != nil {
		t.Fatal(err)
	}
	return s.Text()
}

// reaches sends UDP datagrams from one namespace to dst inside another and
// reports whether one arrived within wait.
func reaches(t testing.TB, from, to *node, dst string, wait time.Duration) bool {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := netns.Do(to.ns, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(dst), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := netns.Do(from.ns, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	got := make(chan bool, 1)
	go func() {
		buf := make([]byte, 64)
		_ = rx.SetReadDeadline(time.Now().Add(wait))
		n, err := rx.Read(buf)
		got <- err == nil && string(buf[:n]) == "probe"
	}()
	stop := time.After(wait)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, _ = tx.Write([]byte("probe"))
		select {
		case ok := <-got:
			return ok
		case <-stop:
			return <-got
		case <-tick.C:
		}
	}
}

const allPaths = "a>b:direct a>b:routed b>a:direct b>a:routed"

// connectivity names the overlay paths that carry traffic ("-" for dead).
func connectivity(t testing.TB, a, b *node, wait time.Duration) string {
	t.Helper()
	var out []string
	for _, c := range []struct {
		name     string
		from, to *node
		dst      string
	}{
		{"a>b:direct", a, b, b.overlay}, {"a>b:routed", a, b, b.loopback},
		{"b>a:direct", b, a, a.overlay}, {"b>a:routed", b, a, a.loopback},
	} {
		if reaches(t, c.from, c.to, c.dst, wait) {
			out = append(out, c.name)
		} else {
			out = append(out, "-")
		}
	}
	return strings.Join(out, " ")
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
	if err := netns.Do(from.ns, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(to.underlay), Port: 9999})
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
		if f := udpFlows(t, n.ns); f[oldPort] == 0 || f[9999] == 0 {
			t.Fatalf("%s: no conntrack entries to assert on: %v", n.ns, f)
		}
	}

	snaps := map[*node]dataplane.Snapshot{}
	for _, n := range []*node{a, b} {
		c, err := n.b.Preflight(ctx, newPort)
		if err != nil || len(c.Problems) != 0 || c.CurrentPort != oldPort {
			t.Fatalf("%s preflight: %+v, %v", n.ns, c, err)
		}
		s, err := n.b.Snapshot(ctx, oldPort, newPort)
		if err != nil {
			t.Fatal(err)
		}
		snaps[n] = persist(t, s)
		if err := n.b.Prepare(ctx, snaps[n]); err != nil {
			t.Fatal(err)
		}
		if !hasRule(t, n.ns, newPort) || !hasRule(t, n.ns, oldPort) {
			t.Fatalf("%s after prepare: iptables-save:\n%s", n.ns, run(t, n.ns, "iptables-save -t filter"))
		}
		if n.text(t) != orig[n] {
			t.Fatalf("%s: prepare touched the device", n.ns)
		}
	}

	for i, n := range []*node{a, b} {
		st, err := n.b.Commit(ctx, snaps[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s commit: %v", n.ns, st.Detail)
		if st.Port != newPort || st.Detail["vni"] != "1" || st.Detail["strategy"] != vxlan.StrategyPrebuilt {
			t.Fatalf("%s commit state %+v", n.ns, st)
		}
		want := strings.Replace(orig[n], fmt.Sprintf("dstport %d", oldPort), fmt.Sprintf("dstport %d", newPort), 1)
		if got := n.text(t); got != want {
			t.Fatalf("%s after commit:\n%s\nwant (all but the port equal):\n%s", n.ns, got, want)
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
	if f := udpFlows(t, b.ns); f[oldPort] != 0 || f[9999] == 0 {
		t.Fatalf("%s after commit: udp conntrack by dport %v: want none for %d, 9999 kept", b.ns, f, oldPort)
	}
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("both on %d: paths %q", newPort, got)
	}
	for _, n := range []*node{a, b} {
		// The new port's rule let the traffic in (INPUT drops other UDP).
		if !regexp.MustCompile(fmt.Sprintf(`\[[1-9]\d*:\d+\] -A %s .*--dport %d `, labChain, newPort)).MatchString(run(t, n.ns, "iptables-save -c -t filter")) {
			t.Fatalf("%s: no packet counted on the %d rule:\n%s", n.ns, newPort, run(t, n.ns, "iptables-save -c -t filter"))
		}
	}

	t.Run("replayed commit is harmless", func(t *testing.T) {
		before := a.text(t)
		idx, _ := a.vx.Snapshot(labDev)
		st, err := a.b.Commit(ctx, snaps[a])
		if err != nil || st.Detail["strategy"] != "noop" {
			t.Fatalf("replay: %+v, %v", st, err)
		}
		after, _ := a.vx.Snapshot(labDev)
		if a.text(t) != before || after.Device.Index != idx.Device.Index {
			t.Fatal("replayed commit recreated the device")
		}
		if f := udpFlows(t, a.ns); f[oldPort] != 0 || f[9999] == 0 {
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
					t.Fatalf("%s revert %d: %+v, %v", n.ns, rep, st, err)
				}
			}
			if got := n.text(t); got != orig[n] {
				t.Fatalf("%s after revert:\n%s\nwant the original:\n%s", n.ns, got, orig[n])
			}
			if hasRule(t, n.ns, newPort) || !hasRule(t, n.ns, oldPort) {
				t.Fatalf("%s after revert: iptables-save:\n%s", n.ns, run(t, n.ns, "iptables-save -t filter"))
			}
			if f := udpFlows(t, n.ns); f[newPort] != 0 || f[9999] == 0 {
				t.Fatalf("%s after revert: udp conntrack by dport %v", n.ns, f)
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
				t.Fatalf("%s: finalize before commit closed the port the device is on", n.ns)
			}
			snaps[n] = s
		}
		for _, n := range []*node{a, b} {
			if _, err := n.b.Commit(ctx, snaps[n]); err != nil {
				t.Fatal(err)
			}
		}
		// A late peer's datagram to the old port.
		if err := netns.Do(b.ns, func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(a.underlay), Port: oldPort})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("late"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if f := udpFlows(t, a.ns); f[oldPort] == 0 {
			t.Fatalf("late datagram left no entry to assert on: %v", f)
		}
		for _, n := range []*node{a, b} {
			if err := n.b.Finalize(ctx, snaps[n]); err != nil {
				t.Fatal(err)
			}
			if !hasRule(t, n.ns, newPort) || hasRule(t, n.ns, oldPort) {
				t.Fatalf("%s after finalize: iptables-save:\n%s", n.ns, run(t, n.ns, "iptables-save -t filter"))
			}
			if f := udpFlows(t, n.ns); f[oldPort] != 0 || f[9999] == 0 {
				t.Fatalf("%s after finalize: udp conntrack by dport %v", n.ns, f)
			}
		}
		if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
			t.Fatalf("finalized on %d: paths %q", newPort, got)
		}
	})
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
	run(t, a.ns, "ip link del "+labDev)
	fresh, closeFn, err := Open(a.ns, Config{Device: labDev, Firewall: a.b.cfg.Firewall}, true)
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
