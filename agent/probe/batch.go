package probe

// The mesh's socket work. A probing agent wakes once per interval: it reads
// every datagram that arrived since the last tick in one recvmmsg, and
// sends the answers to them and this round's probes in one sendmmsg. One
// wake per packet (a blocking reader woken for each request and answer,
// a send call per probe) cost an agent 6 % of a core at 3 peers every
// 10 ms, most of it in the kernel's wake-ups (make bench-agent).
//
// Two agents that probe each other send one datagram per pair and tick,
// not two: the answers to the peer's probes read on a tick ride in this
// node's probe to it on that tick (kindReqResp), which leaves when the
// answers alone would have. Half the datagrams is half the kernel's
// packet path, the larger part of the mesh's cost. The coordinator's sample is
// symmetric for it (every node probes those that probe it). An answer
// rides only to a peer whose probe said it reads one; an agent before
// this gets its answers alone, as before, and answers alone.
//
// Reading late on purpose costs no accuracy: every datagram carries the
// kernel's receive stamp (SO_TIMESTAMPNS), and an answer counts when it
// arrived. What it costs is the answers this node gives: up to one
// interval later than a blocking reader would, which the peer's timeout
// (at least ten intervals) absorbs and which is the same delay on every
// answer of a steady mesh, so no gap between answers grows.
//
// An agent without peers of its own (between operations, or outside an
// operation's subset) has no ticks; it still answers its peers at once,
// from a blocking reader that is parked while the ticks read.
//
// The socket is not Go's net.UDPConn on Linux (sock_linux.go): the
// runtime's poller would be woken by every datagram that arrives, read or
// not, which is the wake per packet again; a plain socket read with
// recvmmsg on the ticks is woken by nothing. Nor is the tick a Go timer
// (pace_linux.go): what a timer wakes in the runtime besides the mesh
// cost ten wakes a tick.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// batch is the most datagrams one read or write moves: 3 peers at 1 ms is
// 6 datagrams a tick; a tick after a stall reads the rest on the next
// call.
const batch = 64

// errAgain is a read that found nothing (now, or within the blocking
// read's short timeout).
var errAgain = errors.New("probe: nothing to read")

// msg is one datagram of a batch.
type msg struct {
	buf  []byte
	n    int // bytes read, or to write
	oob  []byte
	oobn int
	addr netip.AddrPort
}

// buffers holds one goroutine's datagrams: rx for reads, tx for what it
// sends, and the socket's scratch for both; rides are the answers this
// tick's probes will carry.
type buffers struct {
	rx      []msg
	tx      []msg
	txBytes [][packetSize + maxRiding*answerSize]byte
	sc      *scratch
	rides   []ride
}

// ride is an answer waiting for this tick's probe to its asker.
type ride struct {
	to    netip.AddrPort
	seq   uint64
	ts    int64
	taken bool
}

func newBuffers() *buffers {
	b := &buffers{rx: make([]msg, batch), tx: make([]msg, 0, 2*batch), txBytes: make([][packetSize + maxRiding*answerSize]byte, 2*batch), sc: newScratch(2 * batch), rides: make([]ride, 0, maxRiding*MaxPeers)}
	for i := range b.rx {
		b.rx[i].buf = make([]byte, 1500)
		b.rx[i].oob = make([]byte, 128)
	}
	return b
}

// add queues one datagram to send; false when the batch is full.
func (b *buffers) add(p packet, to netip.AddrPort) bool {
	i := len(b.tx)
	if i == len(b.txBytes) {
		return false
	}
	n := encode(b.txBytes[i][:], p)
	b.tx = append(b.tx, msg{buf: b.txBytes[i][:], n: n, addr: to})
	return true
}

// waiting is where in b.rides the answers waiting for a probe to to are,
// the first maxRiding of them, and how many that is.
func (b *buffers) waiting(to netip.AddrPort) (at [maxRiding]int, n int) {
	for i := range b.rides {
		if n < maxRiding && !b.rides[i].taken && b.rides[i].to == to {
			at[n] = i
			n++
		}
	}
	return at, n
}

// answerRides sends alone every answer no probe took (its asker left the
// peer set meanwhile, or the batch was full), then forgets the rides.
func (b *buffers) answerRides(s *sock) {
	for _, r := range b.rides {
		if r.taken {
			continue
		}
		p := packet{kind: kindResp, seq: r.seq, ts: r.ts}
		if !b.add(p, r.to) {
			b.flush(s)
			b.add(p, r.to)
		}
	}
	b.rides = b.rides[:0]
}

// flush sends what was queued. A send error (no route while the overlay
// is down, a full socket buffer) is a lost probe or answer, which the
// counters show; the rest of the batch is still sent.
func (b *buffers) flush(s *sock) {
	// Past what was sent on a local slice: moving b.tx's start on would
	// shrink its capacity a little each time, until every add allocated.
	for tx := b.tx; len(tx) > 0; {
		n, _ := s.write(b.sc, tx)
		tx = tx[max(n, 1):] // past the datagram the kernel refused
	}
	b.tx = b.tx[:0]
}

// RunAt answers and sends probes on listen until ctx ends. The peer set and
// its counters belong to the mesh, not to one run: a mesh restarted on
// another address (the overlay address changed) keeps them.
func (m *Mesh) RunAt(ctx context.Context, listen netip.AddrPort) error {
	if !listen.IsValid() {
		return errors.New("probe: no listen address: want ip:port on the overlay")
	}
	s, err := listenSock(listen)
	if err != nil {
		return fmt.Errorf("probe: listen %s: %w", listen, err)
	}
	pc, err := newPacer()
	if err != nil {
		_ = s.close()
		return fmt.Errorf("probe: timer: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &reader{m: m, s: s, resume: make(chan struct{}, 1), done: make(chan struct{}), wake: pc.wake}
	go r.run(ctx)
	m.mu.Lock()
	m.pacer = pc
	m.mu.Unlock()
	stopWake := context.AfterFunc(ctx, pc.wake)
	defer func() {
		stopWake()
		m.mu.Lock()
		m.pacer = nil
		m.mu.Unlock()
		// The socket closes only once the reader returned, so its number
		// is never reused under a read.
		cancel()
		s.wake()
		<-r.done
		_ = s.close()
		_ = pc.close()
	}()
	bufs := newBuffers()
	for {
		if ctx.Err() != nil {
			return nil
		}
		select {
		case <-r.done:
			return r.err
		default:
		}
		m.mu.Lock()
		idle := len(m.order) == 0
		m.mu.Unlock()
		switch {
		case idle && m.ticking.Load():
			if err := pc.stop(); err != nil {
				return fmt.Errorf("probe: timer: %w", err)
			}
			m.mu.Lock()
			m.lastRound = time.Time{} // no round is due while idle
			m.mu.Unlock()
			m.ticking.Store(false)
			select {
			case r.resume <- struct{}{}:
			default: // a wake is pending already
			}
		case !idle && !m.ticking.Load():
			// The reader parks after the read it is in; until then both
			// may read, which is harmless (each datagram is read once).
			m.ticking.Store(true)
			if err := pc.start(m.cfg.Interval); err != nil {
				return fmt.Errorf("probe: timer: %w", err)
			}
		}
		// Idle, only a wake returns (SetPeers, the end, the reader's
		// error).
		ticks, err := pc.wait()
		if err != nil {
			return fmt.Errorf("probe: timer: %w", err)
		}
		if ticks > 0 && !idle {
			m.tick(s, bufs)
		}
	}
}

// tick reads what arrived since the last tick, answers it, and sends this
// round's probes, the answers and the probes in one batch.
func (m *Mesh) tick(s *sock, b *buffers) {
	for {
		n, err := s.read(b.sc, b.rx, false)
		if n > 0 {
			m.handle(b.rx[:n], b, m.cfg.Interval, true)
		}
		if err != nil || n < len(b.rx) {
			break
		}
		b.flush(s) // a full batch: send its answers before reading on
	}
	m.round(b)
	b.answerRides(s)
	b.flush(s)
}

// round queues one probe to every peer, with the answers to its probes
// riding where some wait.
func (m *Mesh) round(b *buffers) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if !m.lastRound.IsZero() {
		m.noteStallLocked(now.Sub(m.lastRound) - m.cfg.Interval)
	}
	m.lastRound = now
	// A SetPeers replaces m.order, not the peers' states: a peer removed
	// since gets no probe.
	for _, ps := range m.order {
		seq := ps.nextSeq
		sent := m.now()
		p := packet{kind: kindReq, seq: seq, ts: sent.UnixNano() | rides}
		at, n := b.waiting(ps.peer.Addr)
		for i, r := range at[:n] {
			p.kind, p.ans[i] = kindReqResp, echo{b.rides[r].seq, b.rides[r].ts}
		}
		p.nAns = n
		if !b.add(p, ps.peer.Addr) {
			return // the batch is full: the rest go next round
		}
		for _, r := range at[:n] {
			b.rides[r].taken = true
		}
		ps.nextSeq++
		ps.sentAt[seq%window] = sent.UnixNano()
		ps.answered[seq%window] = false
		m.settleLocked(ps, sent)
	}
}

// handle counts the answers in ms and queues the answers to the probes;
// slack is how late the loop reads on purpose (no stall). With mayRide, an
// answer to a peer this mesh probes waits for this tick's probe to it
// (round), where the asker reads one.
func (m *Mesh) handle(ms []msg, b *buffers, slack time.Duration, mayRide bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for i := range ms {
		d := &ms[i]
		p, ok := decode(d.buf[:d.n])
		if !ok {
			continue
		}
		at, stamped := rxStamp(d.oob[:d.oobn])
		from := unmap(d.addr)
		if p.kind == kindReq || p.kind == kindReqResp {
			m.answerLocked(b, from, p.seq, p.ts, mayRide)
			if stamped {
				m.noteStallLocked(now.Sub(stampOrNow(at, now)) - slack)
			}
		}
		if p.kind == kindResp {
			p.ans[0], p.nAns = echo{p.seq, p.ts}, 1
		}
		for _, e := range p.ans[:p.nAns] {
			if stamped {
				m.rxStamped.Add(1)
			}
			m.onReplyLocked(from, e.seq, e.ts&^rides, at, now, slack)
		}
	}
}

// answerLocked answers the probe seq, ts from: riding in this tick's
// probe to from where it may (mayRide: a tick's; from reads riding
// answers; this mesh probes from; fewer than maxRiding answers to it
// wait), else alone.
func (m *Mesh) answerLocked(b *buffers, from netip.AddrPort, seq uint64, ts int64, mayRide bool) {
	m.answered++
	if _, n := b.waiting(from); mayRide && (ts&rides != 0 || rideToAll()) && m.peers[from] != nil && n < maxRiding {
		b.rides = append(b.rides, ride{to: from, seq: seq, ts: ts})
		m.rode++
		return
	}
	if !b.add(packet{kind: kindResp, seq: seq, ts: ts}, from) {
		m.answered-- // more probes than a batch: unanswered, lost to the asker
	}
}

// reader reads with blocking calls while the loop is not ticking, so that
// an agent without peers of its own answers at once; it parks while the
// loop ticks.
type reader struct {
	m      *Mesh
	s      *sock
	resume chan struct{}
	done   chan struct{} // closed when run returns, err set before
	err    error
	wake   func() // the loop's, called once err is set
}

func (r *reader) run(ctx context.Context) {
	defer close(r.done)
	b := newBuffers()
	for {
		if ctx.Err() != nil {
			return
		}
		if r.m.ticking.Load() {
			select {
			case <-r.resume:
			case <-ctx.Done():
			}
			continue
		}
		n, err := r.s.read(b.sc, b.rx, true)
		if n > 0 {
			r.m.handle(b.rx[:n], b, 0, false)
			b.flush(r.s)
		}
		if err != nil && !errors.Is(err, errAgain) {
			r.err = fmt.Errorf("probe: read: %w", err)
			r.wake()
			return
		}
	}
}
