// Package vxlantest builds the two-namespace kernel VXLAN topology that the
// privileged tests and benchmarks of pkg/vxlan and of the kernel-vxlan
// backend run on: two fresh network namespaces joined by a veth pair, a VXLAN
// device in each, set up with ip(8) and bridge(8) so that the code under test
// reads a state it did not make itself, and a UDP reachability check across
// the overlay.
//
// It is test support: only tests and benchmarks may import it. It must not
// touch the host's namespace nor use addresses outside 198.18.0.0/15.
package vxlantest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// Config describes the topology; New fills both namespaces alike.
type Config struct {
	Prefix string // namespace names are <Prefix>-<8 hex digits>-a and -b
	Device string // the VXLAN device, e.g. "vx0" or "flannel.1"
	VNI    int
	Port   int // the device's dstport
	// PinToVeth creates the device with "dev veth0", as flannel does.
	PinToVeth bool
	MTU       int // 0 leaves the kernel's default
	// NoIPv6 turns IPv6 off in both namespaces: its DAD and router
	// solicitations would cross the overlay on their own.
	NoIPv6 bool
}

// Node is one side of the topology.
type Node struct {
	NS       string
	Underlay string // veth0's address
	Overlay  string // the device's address
	Loopback string // on lo, reached through the route via the peer
	Kernel   *vxlan.Kernel
}

// AllPaths is what Connectivity returns when every path carries traffic.
const AllPaths = "a>b:direct a>b:routed b>a:direct b>a:routed"

// New makes two namespaces joined by a veth pair (198.18.0.1 and .2/24),
// each with the device on c.Port (nolearning, 198.18.100.x/24), the flood
// entry and the peer's MAC in the FDB, a permanent neighbour for the peer,
// and a route to 198.18.101.0/24 via the peer, which holds the other end's
// Loopback. Each Node gets a vxlan.Kernel opened in its namespace. Everything
// is deleted in t.Cleanup.
func New(t testing.TB, c Config) (a, b *Node) {
	t.Helper()
	bins := []string{"ip", "bridge", "cat"}
	if c.NoIPv6 {
		bins = append(bins, "sysctl")
	}
	testenv.RequirePrivileged(t, bins...)
	id := rand.Uint32()
	a = &Node{NS: fmt.Sprintf("%s-%08x-a", c.Prefix, id), Underlay: "198.18.0.1", Overlay: "198.18.100.1", Loopback: "198.18.101.2"}
	b = &Node{NS: fmt.Sprintf("%s-%08x-b", c.Prefix, id), Underlay: "198.18.0.2", Overlay: "198.18.100.2", Loopback: "198.18.101.1"}
	for _, n := range []*Node{a, b} {
		if err := netns.Create(n.NS); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.Delete(n.NS) })
		if c.NoIPv6 {
			Run(t, n.NS, "sysctl -q -w net.ipv6.conf.all.disable_ipv6=1")
			Run(t, n.NS, "sysctl -q -w net.ipv6.conf.default.disable_ipv6=1")
		}
	}
	Run(t, a.NS, "ip link add veth0 type veth peer name veth0 netns "+b.NS)
	link := ""
	if c.PinToVeth {
		link = " dev veth0"
	}
	for _, n := range []*Node{a, b} {
		Run(t, n.NS, "ip addr add "+n.Underlay+"/24 dev veth0")
		Run(t, n.NS, "ip link set veth0 up")
		Run(t, n.NS, fmt.Sprintf("ip link add %s type vxlan id %d dstport %d local %s%s nolearning", c.Device, c.VNI, c.Port, n.Underlay, link))
		if c.MTU != 0 {
			Run(t, n.NS, fmt.Sprintf("ip link set %s mtu %d", c.Device, c.MTU))
		}
		Run(t, n.NS, "ip addr add "+n.Overlay+"/24 dev "+c.Device)
		Run(t, n.NS, "ip addr add "+n.Loopback+"/32 dev lo")
		Run(t, n.NS, "ip link set "+c.Device+" up")
	}
	for _, p := range [][2]*Node{{a, b}, {b, a}} {
		self, peer := p[0], p[1]
		mac := strings.TrimSpace(Run(t, peer.NS, "cat /sys/class/net/"+c.Device+"/address"))
		Run(t, self.NS, "bridge fdb append 00:00:00:00:00:00 dev "+c.Device+" dst "+peer.Underlay)
		Run(t, self.NS, "bridge fdb append "+mac+" dev "+c.Device+" dst "+peer.Underlay)
		Run(t, self.NS, "ip neigh replace "+peer.Overlay+" lladdr "+mac+" dev "+c.Device+" nud permanent")
		Run(t, self.NS, "ip route add 198.18.101.0/24 via "+peer.Overlay+" dev "+c.Device)
	}
	for _, n := range []*Node{a, b} {
		k, err := vxlan.Open(n.NS)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		n.Kernel = k
	}
	return a, b
}

// Run runs cmd, split on white space, inside namespace ns and returns its
// combined output; it fails t with both on an error.
func Run(t testing.TB, ns, cmd string) string {
	t.Helper()
	out, err := netns.Command(ns, strings.Fields(cmd)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s: %v: %s", ns, cmd, err, out)
	}
	return string(out)
}

// Reaches sends UDP datagrams from one namespace to dst:9000 inside another
// and reports whether one arrived within wait.
func Reaches(t testing.TB, from, to *Node, dst string, wait time.Duration) bool {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := netns.Do(to.NS, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(dst), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rx.Close() }()
	if err := netns.Do(from.NS, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Close() }()
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

// Connectivity returns which of the four overlay paths carry traffic, as
// text: AllPaths with "-" in place of a dead one.
func Connectivity(t testing.TB, a, b *Node, wait time.Duration) string {
	t.Helper()
	var out []string
	for _, c := range []struct {
		name     string
		from, to *Node
		dst      string
	}{
		{"a>b:direct", a, b, b.Overlay}, {"a>b:routed", a, b, b.Loopback},
		{"b>a:direct", b, a, a.Overlay}, {"b>a:routed", b, a, a.Loopback},
	} {
		if Reaches(t, c.from, c.to, c.dst, wait) {
			out = append(out, c.name)
		} else {
			out = append(out, "-")
		}
	}
	return strings.Join(out, " ")
}

// SaveRules is iptables-save's output without its comment lines: they carry
// the time of the dump, so two dumps a second apart differ by them alone
// (CI runs saw it twice).
func SaveRules(save string) string {
	var keep []string
	for _, line := range strings.Split(save, "\n") {
		if !strings.HasPrefix(line, "#") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
