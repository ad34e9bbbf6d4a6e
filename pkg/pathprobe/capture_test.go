package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// TestControlCapture: the control port is held (as the overlay holds the
// current port), so the frames sent to it reach no socket of the check;
// the packet capture still sees them arrive, from the right peer. A peer
// that sends nothing is not seen.
func TestControlCapture(t *testing.T) {
	testenv.RequireRoot(t)
	held, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctl := uint16(held.LocalAddr().(*net.UDPAddr).Port)
	a, b, c := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	// A common start 100 ms after binding, as the coordinator's start
	// instant gives: both captures are open before any frame leaves (b
	// ends early, its every frame passed, and sends no more control
	// frames after that).
	base := Config{Port: freePort(t), CheckID: "ctl", VNIs: []uint32{1}, Sizes: []int{256}, Window: 300 * time.Millisecond,
		Interval: 50 * time.Millisecond, ControlPort: ctl, ControlVNI: 1, Delay: 100 * time.Millisecond}
	ca, cb := base, base
	ca.Local, ca.Peers = a, []Peer{{"b", b}, {"c", c}}
	cb.Local, cb.Peers = b, []Peer{{"a", a}}
	var wg sync.WaitGroup
	var ra, rb []Result
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); ra, ea = Run(context.Background(), ca) }()
	go func() { defer wg.Done(); rb, eb = Run(context.Background(), cb) }()
	wg.Wait()
	if ea != nil || eb != nil {
		t.Fatal(ea, eb)
	}
	controls := func(rs []Result) map[string]Result {
		m := map[string]Result{}
		for _, r := range rs {
			if r.Control {
				m[r.Peer] = r
			}
		}
		return m
	}
	ka, kb := controls(ra), controls(rb)
	if r := ka["b"]; !r.Received || r.Sent == 0 || r.ControlErr != "" {
		t.Errorf("a's control from b: %+v", r)
	}
	if r := kb["a"]; !r.Received || r.Sent == 0 {
		t.Errorf("b's control from a: %+v", r)
	}
	if r := ka["c"]; r.Received {
		t.Errorf("a's control from the silent c: %+v", r)
	}
	// The held socket got them too, as the overlay would: they went to
	// the real port.
	_ = held.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, MaxSize)
	n, _, err := held.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("the control port's holder got nothing: %v", err)
	}
	if f, err := Unmarshal(buf[:n]); err != nil || f.Kind != Control {
		t.Fatalf("holder got %+v, %v", f, err)
	}
}

// TestWireSeesOwnFirewallDrop: in a fresh network namespace, b's
// own INPUT chain drops what comes to the port under test (real iptables,
// no ESTABLISHED rule before it: a stateless firewall). a's frames reach
// b's interface and no socket of b's: b's capture sees them (Wire), its
// socket does not (Received), so a's frames crossed the network and b's
// firewall dropped them. The other way, nothing is dropped: b's frames
// reach a's socket and its capture alike. The control frames to the held
// current port are seen on the same terms, at every size.
func TestWireSeesOwnFirewallDrop(t *testing.T) {
	testenv.RequirePrivileged(t, "iptables")
	ns := testenv.Netns(t, "cot-wire")
	if out, err := netns.Command(ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	port := uint16(40889)
	rule := []string{"iptables", "-t", "filter", "-A", "INPUT", "-d", b.String(), "-p", "udp", "--dport", fmt.Sprint(port), "-j", "DROP"}
	if out, err := netns.Command(ns, rule...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", rule, err, out)
	}
	// Each side in the namespace on its own thread: Run opens its sockets
	// on the calling goroutine's.
	var held *net.UDPConn
	if err := netns.Do(ns, func() (err error) {
		held, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	base := Config{Port: port, CheckID: "wire", VNIs: []uint32{1, 3079}, Sizes: []int{256, 1000}, Window: 300 * time.Millisecond,
		Interval: 50 * time.Millisecond, ControlPort: uint16(held.LocalAddr().(*net.UDPAddr).Port), ControlVNI: 1, Delay: 100 * time.Millisecond}
	ca, cb := base, base
	ca.Local, ca.Peers = a, []Peer{{"b", b}}
	cb.Local, cb.Peers = b, []Peer{{"a", a}}
	var wg sync.WaitGroup
	var ra, rb []Result
	var ea, eb error
	wg.Add(2)
	go func() {
		defer wg.Done()
		ea = netns.Do(ns, func() (err error) { ra, err = Run(context.Background(), ca); return err })
	}()
	go func() {
		defer wg.Done()
		eb = netns.Do(ns, func() (err error) { rb, err = Run(context.Background(), cb); return err })
	}()
	wg.Wait()
	if err := errors.Join(ea, eb); err != nil {
		t.Fatal(err)
	}
	controls := 0
	for _, r := range rb {
		if r.Control {
			controls++
			if !r.Received || r.ControlErr != "" {
				t.Errorf("b's control from a: %+v", r)
			}
			continue
		}
		if !r.Wire || r.Received {
			t.Errorf("b from a: %+v: want seen on the interface (wire) and not by the socket (b's firewall drops it)", r)
		}
	}
	if controls != 3 { // VNI 1 at 256 and 1000, VNI 3079 at 256
		t.Errorf("b has %d control results, want 3: %+v", controls, rb)
	}
	for _, r := range ra {
		if !r.Control && (!r.Wire || !r.Received || r.Answered) {
			t.Errorf("a from b: %+v: want b's frames seen and received, a's unanswered", r)
		}
	}
}
