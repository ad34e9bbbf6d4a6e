package vxlan_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/testenv"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// node is one side of a two-namespace VXLAN lab, set up with ip(8) and
// bridge(8) so that the driver reads a state it did not make itself.
type node struct {
	ns       string
	underlay string // veth address
	overlay  string // address on vx0
	loopback string // address on lo, reached through the route via the peer
	k        *vxlan.Kernel
}

const (
	dev = "vx0"
	vni = 42
)

// newLab makes two namespaces joined by a veth pair, each with vx0 on port,
// VNI 42, nolearning, the flood entry and the peer's MAC in the FDB, a
// permanent neighbour for the peer and a route to 198.18.101.0/24 via it.
func newLab(t testing.TB, port int) (a, b *node) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "bridge")
	id := rand.Uint32()
	a = &node{ns: fmt.Sprintf("cot-vxlan-%08x-a", id), underlay: "198.18.0.1", overlay: "198.18.100.1", loopback: "198.18.101.2"}
	b = &node{ns: fmt.Sprintf("cot-vxlan-%08x-b", id), underlay: "198.18.0.2", overlay: "198.18.100.2", loopback: "198.18.101.1"}
	for _, n := range []*node{a, b} {
		if err := netns.Create(n.ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.Delete(n.ns) })
	}
	run(t, a.ns, "ip link add veth0 type veth peer name veth0 netns "+b.ns)
	for _, n := range []*node{a, b} {
		run(t, n.ns, "ip addr add "+n.underlay+"/24 dev veth0")
		run(t, n.ns, "ip link set veth0 up")
		run(t, n.ns, fmt.Sprintf("ip link add %s type vxlan id %d dstport %d local %s nolearning", dev, vni, port, n.underlay))
		run(t, n.ns, "ip addr add "+n.overlay+"/24 dev "+dev)
		run(t, n.ns, "ip addr add "+n.loopback+"/32 dev lo")
		run(t, n.ns, "ip link set "+dev+" up")
		k, err := vxlan.Open(n.ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		n.k = k
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		self, peer := p[0], p[1]
		mac := macOf(t, peer)
		run(t, self.ns, "bridge fdb append 00:00:00:00:00:00 dev "+dev+" dst "+peer.underlay)
		run(t, self.ns, "bridge fdb append "+mac+" dev "+dev+" dst "+peer.underlay)
		run(t, self.ns, "ip neigh replace "+peer.overlay+" lladdr "+mac+" dev "+dev+" nud permanent")
		run(t, self.ns, "ip route add 198.18.101.0/24 via "+peer.overlay+" dev "+dev)
	}
	return a, b
}

func macOf(t testing.TB, n *node) string {
	t.Helper()
	s, err := n.k.Snapshot(dev)
	if err != nil {
		t.Fatal(err)
	}
	return s.Device.MAC
}

func run(t testing.TB, ns, cmd string) string {
	t.Helper()
	out, err := netns.Command(ns, strings.Fields(cmd)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s: %v: %s", ns, cmd, err, out)
	}
	return string(out)
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

// connectivity returns which of the four overlay paths carry traffic, as
// text: "a>b:direct a>b:routed b>a:direct b>a:routed" with "-" for a dead one.
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
