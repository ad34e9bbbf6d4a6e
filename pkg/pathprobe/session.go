package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Peer is a node the check exchanges frames with.
type Peer struct {
	Name string
	Addr netip.Addr // its underlay address
}

// Config is one node's side of a check.
type Config struct {
	Local   netip.Addr // the underlay address to bind
	Port    uint16     // the port under test
	CheckID string
	// Peers are sent requests; ListenFor are only answered (a sampled
	// check where they send to this node but it does not send to them).
	Peers     []Peer
	ListenFor []Peer
	VNIs      []uint32
	Sizes     []int // outer IPv4 packet sizes
	Window    time.Duration
	Interval  time.Duration
	// ControlPort, when set, is the current port, held by the overlay:
	// control frames are sent to every peer on it too, and a Capture sees
	// the peers' arrive. They mirror the frames to Port, so that a problem
	// the current port has as well is told from one only the new port has:
	// ControlVNI at every size, and each other VNI at the smallest. A pair
	// that passes nothing on either port says nothing about the new one.
	ControlPort uint16
	ControlVNI  uint32
	// Delay is how long after binding the first frames go out (the
	// agents' common start instant); the window runs from then.
	Delay time.Duration
}

// Result is one (peer, VNI, size) as seen by this node.
type Result struct {
	Peer     string
	VNI      uint32
	Size     int
	Sent     int
	Answered bool   // our request came back answered: both directions pass
	Received bool   // the peer's request arrived: peer → here passes
	SendErr  string // the local send failed (EMSGSIZE: the local MTU)
	// Wire says a frame of the peer's (its request or its answer) was
	// seen arriving on this node's interfaces by the Capture, before the
	// node's own firewall: the underlay carried peer → here, whether or
	// not the socket got it. Always false when no capture ran.
	Wire bool
	// Control marks the result of the control frames on ControlPort (one
	// per control VNI and size): Received says the peer's control frames
	// were seen arriving here; ControlErr why no capture could run
	// (Received then means nothing, and no Wire of this check either).
	Control    bool
	ControlErr string
}

// BindError is the port under test not bindable on this node: held by
// something else (the overlay itself, another program).
type BindError struct {
	Addr netip.AddrPort
	Err  error
}

func (e *BindError) Error() string {
	return fmt.Sprintf("cannot bind udp %s for the path check: %v", e.Addr, e.Err)
}

func (e *BindError) Unwrap() error { return e.Err }

// InUse reports whether the bind failed because the port is taken.
func (e *BindError) InUse() bool { return errors.Is(e.Err, syscall.EADDRINUSE) }

// Validate checks cfg, naming the field at fault.
func (c Config) Validate() error {
	switch {
	case !c.Local.Is4() || c.Local.IsUnspecified():
		return fmt.Errorf("local address %q: want the node's underlay IPv4 address", c.Local)
	case c.Port == 0:
		return fmt.Errorf("port 0: want 1–65535")
	case c.CheckID == "":
		return fmt.Errorf("check id empty: every frame carries its nonce")
	case len(c.VNIs) == 0:
		return fmt.Errorf("vnis empty: want at least one VNI")
	case len(c.Sizes) == 0:
		return fmt.Errorf("sizes empty: want at least one packet size")
	case c.ControlPort != 0 && c.ControlPort == c.Port:
		return fmt.Errorf("control port %d: the port under test itself; want the current port", c.ControlPort)
	case c.ControlVNI >= 1<<24:
		return fmt.Errorf("control vni %d: want 0–%d (24 bits)", c.ControlVNI, 1<<24-1)
	case c.Delay < 0 || c.Delay > 10*time.Second:
		return fmt.Errorf("delay %s: want 0 to 10s", c.Delay)
	case c.Window <= 0 || c.Window > time.Minute:
		return fmt.Errorf("window %s: want more than 0 and at most 1m", c.Window)
	case c.Interval <= 0 || c.Interval > c.Window:
		return fmt.Errorf("interval %s: want more than 0 and at most the window (%s)", c.Interval, c.Window)
	}
	for _, v := range c.VNIs {
		if v >= 1<<24 {
			return fmt.Errorf("vni %d: want 0–%d (24 bits)", v, 1<<24-1)
		}
	}
	for _, s := range c.Sizes {
		if s < MinSize || s > MaxSize {
			return fmt.Errorf("size %d: want %d–%d bytes", s, MinSize, MaxSize)
		}
	}
	for _, p := range append(slices.Clone(c.Peers), c.ListenFor...) {
		if !p.Addr.Is4() || p.Addr.IsUnspecified() {
			return fmt.Errorf("peer %q address %q: want an IPv4 underlay address", p.Name, p.Addr)
		}
		if p.Addr == c.Local {
			return fmt.Errorf("peer %q address %s: this node's own address", p.Name, p.Addr)
		}
	}
	return nil
}

// linger is how long a check whose every frame passed stays bound,
// answering only: past a peer's next resend of a request whose answer was
// lost.
func linger(interval time.Duration) time.Duration { return interval + interval/2 }

// Sending is paced: a pause of paceGap after every paceEvery frames.
const (
	paceEvery = 16
	paceGap   = 500 * time.Microsecond
)

// FrameID is one (VNI, outer size) of a check's frames.
type FrameID struct {
	VNI  uint32
	Size int
}

// ControlFrames are the control frames of a check with vnis and sizes:
// controlVNI at every size (an MTU problem the current port has too) and
// each other VNI at the smallest (a VNI it drops too).
func ControlFrames(vnis []uint32, sizes []int, controlVNI uint32) []FrameID {
	var out []FrameID
	for _, z := range slices.Sorted(slices.Values(sizes)) {
		out = append(out, FrameID{controlVNI, z})
	}
	small := slices.Min(sizes)
	for _, v := range vnis {
		if v != controlVNI {
			out = append(out, FrameID{v, small})
		}
	}
	return slices.Compact(out)
}

type key struct {
	peer string
	vni  uint32
	size int
}

// Run binds cfg.Port on cfg.Local, exchanges frames with the peers for
// cfg.Window and returns what it saw, one Result per (peer of Peers or
// ListenFor, VNI, size), sorted. The socket is closed when Run returns.
// A port that cannot be bound is a *BindError.
//
// Run ends before the window once every frame is accounted for: each of
// its requests answered and each peer's request received. These flags
// only ever go from false to true, so what it returns then is what the
// whole window would have returned, but for the Sent counts (fewer
// resends) and the control frames: those are not waited for (a peer that
// ended sends no more, and one lost would hold the window), and they judge
// only a direction where nothing passed, whose two sides then both hold
// their windows and keep sending them. Until then, and whenever a frame is
// missing (a blocked direction, an MTU, a silent peer, a peer that does not
// send to this node), it holds the port for the whole window: a healthy
// underlay is judged about one round trip and 1.5 resend intervals
// (linger) after the common start, a broken one as before. A peer whose
// answer from this node is lost twice resends into a closed port and holds
// its own window: slower, never a different verdict (a direction passes on
// either side's evidence, and this node's says it passed).
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	addr := netip.AddrPortFrom(cfg.Local, cfg.Port)
	lc := net.ListenConfig{Control: dontFragment}
	pc, err := lc.ListenPacket(ctx, "udp4", addr.String())
	if err != nil {
		var se *net.OpError
		if errors.As(err, &se) && se.Err != nil {
			err = se.Err
		}
		return nil, &BindError{Addr: addr, Err: err}
	}
	conn := pc.(*net.UDPConn)
	defer func() { _ = conn.Close() }()

	nonce := Nonce(cfg.CheckID)
	byAddr := map[netip.Addr]string{}
	sends := map[string]bool{} // the peers this node sends requests to
	for _, p := range cfg.Peers {
		sends[p.Name] = true
	}
	res := map[key]*Result{}
	for _, p := range append(slices.Clone(cfg.Peers), cfg.ListenFor...) {
		byAddr[p.Addr] = p.Name
		for _, v := range cfg.VNIs {
			for _, s := range cfg.Sizes {
				res[key{p.Name, v, s}] = &Result{Peer: p.Name, VNI: v, Size: s}
			}
		}
	}
	var mu sync.Mutex
	// missing counts the flags still false that the early end waits
	// for; complete is closed when it reaches 0.
	missing := len(res)
	for k := range res {
		if sends[k.peer] {
			missing++
		}
	}
	complete := make(chan struct{})
	if missing == 0 {
		close(complete) // no peer at all
	}
	account := func() {
		if missing--; missing == 0 {
			close(complete)
		}
	}
	deadline := time.Now().Add(cfg.Delay + cfg.Window)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)

	control := map[key]*Result{}
	var controlFrames []FrameID
	if cfg.ControlPort != 0 {
		controlFrames = ControlFrames(cfg.VNIs, cfg.Sizes, cfg.ControlVNI)
	}
	stopCapture := make(chan struct{})
	captured := make(chan struct{})
	// The capture sees the frames to the port under test and the control
	// frames to the current port alike, as they reach the node's
	// interfaces, before its firewall and before the overlay.
	capt, err := OpenCapture(cfg.Port, cfg.ControlPort)
	cerr := ""
	if err != nil {
		cerr = err.Error()
	}
	for _, p := range append(slices.Clone(cfg.Peers), cfg.ListenFor...) {
		for _, f := range controlFrames {
			control[key{p.Name, f.VNI, f.Size}] = &Result{Peer: p.Name, VNI: f.VNI, Size: f.Size, Control: true, ControlErr: cerr}
		}
	}
	if capt == nil {
		close(captured)
	} else {
		go func() {
			defer close(captured)
			defer func() { _ = capt.Close() }()
			capt.Run(deadline, stopCapture, nonce, func(from, to netip.Addr, port uint16, f Frame) {
				name, ok := byAddr[from]
				if !ok || to != cfg.Local { // a peer's frame for another node is no evidence about this one
					return
				}
				k := key{name, f.VNI, f.Size}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case f.Kind == Control && port == cfg.ControlPort:
					if r := control[k]; r != nil {
						r.Received = true
					}
				case (f.Kind == Request || f.Kind == Answer) && port == cfg.Port:
					if r := res[k]; r != nil {
						r.Wire = true
					}
				}
			})
		}()
	}
	defer func() { close(stopCapture); <-captured }()

	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, MaxSize)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					return
				}
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // an ICMP error surfaced on the socket: keep reading
			}
			f, err := Unmarshal(buf[:n])
			if err != nil || f.Nonce != nonce {
				continue
			}
			name, ok := byAddr[from.Addr().Unmap()]
			if !ok {
				continue
			}
			mu.Lock()
			r := res[key{name, f.VNI, f.Size}]
			switch {
			case r == nil:
			case f.Kind == Request && !r.Received:
				r.Received = true
				account()
			case f.Kind == Answer && !r.Answered:
				r.Answered = true
				if sends[name] {
					account()
				}
			}
			mu.Unlock()
			if r != nil && f.Kind == Request {
				f.Kind = Answer
				if b, err := f.Marshal(); err == nil {
					_, _ = conn.WriteToUDPAddrPort(b, from)
				}
			}
		}
	}()

	if cfg.Delay > 0 {
		// Bound and answering meanwhile: a peer that starts early is
		// answered from the first frame.
		select {
		case <-time.After(cfg.Delay):
		case <-ctx.Done():
		case <-complete: // only ListenFor peers, all heard
		}
	}
	var seq uint32
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for round := 0; ; round++ {
		// Peers inner: a round goes to every peer in turn, paced, not
		// as one burst per peer (a busy software switch drops bursts).
		sent := 0
		for _, v := range cfg.VNIs {
			for _, s := range cfg.Sizes {
				for _, p := range cfg.Peers {
					mu.Lock()
					r := res[key{p.Name, v, s}]
					skip := r.Answered
					mu.Unlock()
					if skip {
						continue
					}
					seq++
					b, err := Frame{Kind: Request, Nonce: nonce, VNI: v, Size: s, Seq: seq}.Marshal()
					if err == nil {
						_, err = conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(p.Addr, cfg.Port))
					}
					mu.Lock()
					if err != nil {
						r.SendErr = err.Error()
					} else {
						r.Sent++
					}
					mu.Unlock()
					if sent++; sent%paceEvery == 0 {
						time.Sleep(paceGap)
					}
				}
			}
		}
		for _, f := range controlFrames {
			for _, p := range cfg.Peers {
				seq++
				b, err := Frame{Kind: Control, Nonce: nonce, VNI: f.VNI, Size: f.Size, Seq: seq}.Marshal()
				if err == nil {
					_, err = conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(p.Addr, cfg.ControlPort))
				}
				mu.Lock()
				r := control[key{p.Name, f.VNI, f.Size}]
				if err != nil {
					r.SendErr = err.Error()
				} else {
					r.Sent++
				}
				mu.Unlock()
				if sent++; sent%paceEvery == 0 {
					time.Sleep(paceGap)
				}
			}
		}
		// The last round leaves one interval for its answers.
		if time.Until(deadline) < 2*cfg.Interval {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		case <-complete:
		}
		if ctx.Err() != nil || isClosed(complete) {
			break
		}
	}
	if isClosed(complete) {
		// Still bound, answering, for one resend interval and a half: a
		// peer whose last answer from here was lost resends it at its
		// next tick, and without an answer would hold its whole window
		// (one run in five on the 8-node OVS lab, make bench-pathcheck).
		if end := time.Now().Add(linger(cfg.Interval)); end.Before(deadline) {
			_ = conn.SetReadDeadline(end)
		}
	}
	<-done
	out := make([]Result, 0, len(res)+len(control))
	mu.Lock()
	for _, r := range res {
		out = append(out, *r)
	}
	for _, r := range control {
		out = append(out, *r)
	}
	mu.Unlock()
	slices.SortFunc(out, func(a, b Result) int {
		switch {
		case a.Peer != b.Peer:
			return cmpStr(a.Peer, b.Peer)
		case a.Control != b.Control:
			if a.Control {
				return 1
			}
			return -1
		case a.VNI != b.VNI:
			return int(a.VNI) - int(b.VNI)
		}
		return a.Size - b.Size
	})
	return out, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
