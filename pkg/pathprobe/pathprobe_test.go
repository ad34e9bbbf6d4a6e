package pathprobe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	f := Frame{Kind: Request, Nonce: Nonce("c1"), VNI: 0xabcdef, Size: 1500, Seq: 7}
	b, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 1500-OuterOverhead {
		t.Fatalf("payload %d bytes, want %d", len(b), 1500-OuterOverhead)
	}
	// RFC 7348: I flag, VNI in bytes 4–6.
	if b[0] != 0x08 || b[4] != 0xab || b[5] != 0xcd || b[6] != 0xef || b[7] != 0 {
		t.Fatalf("VXLAN header % x", b[:8])
	}
	if [6]byte(b[8:14]) != InnerDstMAC() {
		t.Fatalf("inner dst MAC % x", b[8:14])
	}
	if checksum(b[22:42]) != 0 {
		t.Fatal("inner IPv4 header checksum does not verify")
	}
	g, err := Unmarshal(b)
	if err != nil || g != f {
		t.Fatalf("Unmarshal = %+v, %v; want %+v", g, err, f)
	}
	// A rewritten VNI or a truncated frame is not counted.
	b2 := append([]byte(nil), b...)
	b2[6] ^= 1
	if _, err := Unmarshal(b2); err == nil || !strings.Contains(err.Error(), "VNI") {
		t.Fatalf("rewritten VNI: err %v", err)
	}
	if _, err := Unmarshal(b[:len(b)-1]); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated: err %v", err)
	}
	b2 = append([]byte(nil), b...)
	b2[0] = 0
	if _, err := Unmarshal(b2); err == nil {
		t.Fatal("no I flag: accepted")
	}
}

func TestMarshalBadInput(t *testing.T) {
	for _, f := range []Frame{{Size: MinSize - 1}, {Size: 70000}, {Size: 200, VNI: 1 << 24}} {
		if _, err := f.Marshal(); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Config{Local: netip.MustParseAddr("127.0.0.1"), Port: 4889, CheckID: "c", VNIs: []uint32{1}, Sizes: []int{200}, Window: time.Second, Interval: 100 * time.Millisecond}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"local address": func(c *Config) { c.Local = netip.Addr{} },
		"port 0":        func(c *Config) { c.Port = 0 },
		"vni 16777216":  func(c *Config) { c.VNIs = []uint32{1 << 24} },
		"size 10":       func(c *Config) { c.Sizes = []int{10} },
		"window 0s":     func(c *Config) { c.Window = 0 },
		"interval 2s":   func(c *Config) { c.Interval = 2 * time.Second },
		"own address":   func(c *Config) { c.Peers = []Peer{{"x", c.Local}} },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), strings.Fields(name)[0]) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

// TestLoopbackPair runs two nodes' sides of a check on 127.0.0.1 and
// 127.0.0.2, both bound on the same port: every frame passes both ways.
func TestLoopbackPair(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	port := freePort(t)
	base := Config{Port: port, CheckID: "loop", VNIs: []uint32{0, 1}, Sizes: []int{200, 1400}, Window: 400 * time.Millisecond, Interval: 50 * time.Millisecond}
	ca, cb := base, base
	ca.Local, ca.Peers = a, []Peer{{"b", b}}
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
	for _, rs := range [][]Result{ra, rb} {
		if len(rs) != 4 {
			t.Fatalf("%d results, want 4: %+v", len(rs), rs)
		}
		for _, r := range rs {
			if !r.Answered || !r.Received || r.Sent == 0 || r.SendErr != "" {
				t.Errorf("%+v: want answered, received", r)
			}
		}
	}
}

// TestEndsWhenComplete: a pair whose every frame passed both ways
// returns at once, not at the window's end (10 s here), with what the
// window would have given.
func TestEndsWhenComplete(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	const window = 10 * time.Second
	base := Config{Port: freePort(t), CheckID: "early", VNIs: []uint32{0, 1}, Sizes: []int{200, 1400}, Window: window, Interval: 50 * time.Millisecond}
	ca, cb := base, base
	ca.Local, ca.Peers = a, []Peer{{"b", b}}
	cb.Local, cb.Peers = b, []Peer{{"a", a}}
	rs, took, errs := runAll(ca, cb)
	for i, name := range []string{"a", "b"} {
		if errs[i] != nil {
			t.Fatalf("%s: %v", name, errs[i])
		}
		// Half the window: far more than a loaded machine's round trips
		// on loopback, far less than the window.
		if took[i] > window/2 {
			t.Errorf("%s took %v: every frame passed, it should not hold the %v window", name, took[i], window)
		}
		if len(rs[i]) != 4 {
			t.Fatalf("%s: %d results, want 4", name, len(rs[i]))
		}
		for _, r := range rs[i] {
			if !r.Answered || !r.Received || r.Sent == 0 {
				t.Errorf("%s: %+v: want answered and received", name, r)
			}
		}
	}
}

// TestListenerEndsSenderHolds: a node that only listens for a peer (a
// sampled check's ListenFor) ends once it heard every frame; the peer,
// which never hears requests from it, holds its window: a direction it
// has no request from is not judged before the window ends.
func TestListenerEndsSenderHolds(t *testing.T) {
	a, c := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.3")
	const window = 600 * time.Millisecond
	base := Config{Port: freePort(t), CheckID: "listen", VNIs: []uint32{1}, Sizes: []int{200, 1400}, Window: window, Interval: 50 * time.Millisecond}
	ca, cc := base, base
	ca.Local, ca.Peers = a, []Peer{{"c", c}}
	cc.Local, cc.ListenFor = c, []Peer{{"a", a}}
	rs, took, errs := runAll(ca, cc)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if took[0] < window {
		t.Errorf("a returned after %v, inside its %v window, with no request from c heard", took[0], window)
	}
	if took[1] >= window {
		t.Errorf("c took %v: it heard every frame it listens for, it should end early", took[1])
	}
	for _, r := range rs[0] {
		if !r.Answered || r.Received {
			t.Errorf("a: %+v: want answered by c, nothing received from it", r)
		}
	}
	for _, r := range rs[1] {
		if !r.Received || r.Answered || r.Sent != 0 {
			t.Errorf("c: %+v: want a's requests received, nothing sent", r)
		}
	}
}

// TestLingerAnswersResend: a check that has every frame stays bound long
// enough to answer a peer's resend of a request whose answer was lost (a
// hand-driven peer drops the first answer): that peer is not left holding
// its window for want of an answer.
func TestLingerAnswersResend(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	const interval = 50 * time.Millisecond
	cfg := Config{Local: a, Port: freePort(t), CheckID: "linger", VNIs: []uint32{1}, Sizes: []int{200}, Window: 5 * time.Second,
		Interval: interval, Peers: []Peer{{"b", b}}}
	peer, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, cfg.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	var rs []Result
	var took time.Duration
	done := make(chan error, 1)
	go func() {
		start := time.Now()
		var err error
		rs, err = Run(context.Background(), cfg)
		took = time.Since(start)
		done <- err
	}()
	nonce := Nonce(cfg.CheckID)
	to := netip.AddrPortFrom(a, cfg.Port)
	send := func(f Frame) {
		t.Helper()
		buf, err := f.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := peer.WriteToUDPAddrPort(buf, to); err != nil {
			t.Fatal(err)
		}
	}
	next := func(kind Kind) Frame {
		t.Helper()
		buf := make([]byte, MaxSize)
		_ = peer.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			n, _, err := peer.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("waiting for a %d frame: %v", kind, err)
			}
			if f, err := Unmarshal(buf[:n]); err == nil && f.Nonce == nonce && f.Kind == kind {
				return f
			}
		}
	}
	// a's request, answered: a has its answer.
	req := next(Request)
	req.Kind = Answer
	send(req)
	// b's request: a has every frame now and answers it; that answer is
	// "lost" (read and ignored), and b resends one interval later.
	mine := Frame{Kind: Request, Nonce: nonce, VNI: 1, Size: 200, Seq: 1}
	send(mine)
	next(Answer)
	time.Sleep(interval)
	mine.Seq = 2
	send(mine)
	if ans := next(Answer); ans.Seq != 2 {
		t.Fatalf("answer to seq %d, want the resend's (2)", ans.Seq)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took >= cfg.Window || len(rs) != 1 || !rs[0].Answered || !rs[0].Received {
		t.Fatalf("a: took %v (window %v), %+v: want it ended early, answered and received", took, cfg.Window, rs)
	}
}

// runAll runs the configs' sides of one check at once.
func runAll(cfgs ...Config) (rs [][]Result, took []time.Duration, errs []error) {
	rs, took, errs = make([][]Result, len(cfgs)), make([]time.Duration, len(cfgs)), make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() {
			start := time.Now()
			rs[i], errs[i] = Run(context.Background(), cfg)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	return rs, took, errs
}

// TestSilentPeerHoldsWindow: one silent peer among live ones holds the
// port for the whole window (its frames may still come), while the live
// peer, whose every frame passed, ends early. A check that ended on the
// frames it had would judge the silent direction on half its window.
func TestSilentPeerHoldsWindow(t *testing.T) {
	a, b, silent := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	const window = 600 * time.Millisecond
	base := Config{Port: freePort(t), CheckID: "hold", VNIs: []uint32{1}, Sizes: []int{200}, Window: window, Interval: 50 * time.Millisecond}
	ca, cb := base, base
	ca.Local, ca.Peers = a, []Peer{{"b", b}, {"s", silent}}
	cb.Local, cb.Peers = b, []Peer{{"a", a}}
	rs, took, errs := runAll(ca, cb)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	ra, rb, tookA, tookB := rs[0], rs[1], took[0], took[1]
	if tookA < window {
		t.Errorf("a returned after %v, inside its %v window, with peer s never heard", tookA, window)
	}
	if tookB >= window {
		t.Errorf("b took %v: its only peer passed every frame, it should end early", tookB)
	}
	for _, r := range ra {
		if live := r.Peer == "b"; r.Answered != live || r.Received != live {
			t.Errorf("a: %+v: want b answered and received, s neither", r)
		}
	}
	if len(rb) != 1 || !rb[0].Answered || !rb[0].Received {
		t.Errorf("b: %+v", rb)
	}
}

// TestSilentPeer: a peer that never answers is neither answered nor
// received; the frames were sent.
func TestSilentPeer(t *testing.T) {
	port := freePort(t)
	c := Config{Local: netip.MustParseAddr("127.0.0.1"), Port: port, CheckID: "s", VNIs: []uint32{1}, Sizes: []int{200},
		Window: 200 * time.Millisecond, Interval: 50 * time.Millisecond, Peers: []Peer{{"b", netip.MustParseAddr("127.0.0.3")}}}
	rs, err := Run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Answered || rs[0].Received || rs[0].Sent < 2 {
		t.Fatalf("%+v", rs)
	}
}

func TestBindInUse(t *testing.T) {
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := uint16(l.LocalAddr().(*net.UDPAddr).Port)
	c := Config{Local: netip.MustParseAddr("127.0.0.1"), Port: port, CheckID: "b", VNIs: []uint32{1}, Sizes: []int{200}, Window: 100 * time.Millisecond, Interval: 50 * time.Millisecond}
	_, err = Run(context.Background(), c)
	var be *BindError
	if !errors.As(err, &be) || !be.InUse() || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err %v: want a BindError, address in use", err)
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.LocalAddr().(*net.UDPAddr).Port)
}
