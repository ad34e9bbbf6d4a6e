package pathprobe

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
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
