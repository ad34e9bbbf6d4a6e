package probe

// The mesh's socket work. A probing agent wakes once per interval: it reads
// every datagram that arrived since the last tick in one recvmmsg, and
// sends the answers to them and this round's probes in one sendmmsg. One
// wake per packet (a blocking reader woken for each request and answer,
// a send call per probe) cost an agent 6 % of a core at 3 peers every
// 10 ms, most of it in the kernel's wake-ups (make bench-agent).
//
// Reading late on purpose costs no accuracy: every datagram carries the
// kernel's receive stamp (SO_TIMESTAMPNS), and an answer counts when it
// arrived. What it costs is the answers this node gives: up to one
// interval later than a blocking reader would, which the peer's timeout
// (at least ten intervals) absorbs and which is the same delay on every
// answer of a steady mesh, so no gap between answers grows.
//
// An agent without peers of its own (between operations, or outside an
// operation's subset) has no ticker; it still answers its peers at once,
// from a blocking reader that is parked while the ticks read.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// batch is the most datagrams one recvmmsg or sendmmsg moves: 3 peers at
// 1 ms is 6 datagrams a tick; a tick after a stall reads the rest on the
// next call.
const batch = 64

// batchConn is ipv4.PacketConn or ipv6.PacketConn (their Message is the
// same type).
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// buffers holds a loop's datagrams: rx for reads, tx for what a tick sends.
type buffers struct {
	rx     []ipv4.Message
	tx     []ipv4.Message
	txBufs [][packetSize]byte
}

func newBuffers() *buffers {
	b := &buffers{rx: make([]ipv4.Message, batch), tx: make([]ipv4.Message, 0, 2*batch), txBufs: make([][packetSize]byte, 2*batch)}
	for i := range b.rx {
		b.rx[i].Buffers = [][]byte{make([]byte, 1500)}
		b.rx[i].OOB = make([]byte, 128)
	}
	return b
}

// add queues one datagram to send; false when the batch is full.
func (b *buffers) add(kind byte, seq uint64, ts int64, to net.Addr) bool {
	i := len(b.tx)
	if i == len(b.txBufs) {
		return false
	}
	encode(b.txBufs[i][:], kind, seq, ts)
	b.tx = append(b.tx, ipv4.Message{Buffers: [][]byte{b.txBufs[i][:]}, Addr: to})
	return true
}

// flush sends what was queued. A send error (no route while the overlay
// is down, say) is a lost probe or answer, which the counters show; the
// rest of the batch is still sent.
func (b *buffers) flush(c batchConn) {
	for len(b.tx) > 0 {
		n, err := c.WriteBatch(b.tx, 0)
		if n <= 0 {
			n = 1 // skip the datagram the kernel refused
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			break
		}
		b.tx = b.tx[n:]
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
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(listen))
	if err != nil {
		return fmt.Errorf("probe: listen %s: %w", listen, err)
	}
	enableRxStamps(conn)
	var bc batchConn = ipv4.NewPacketConn(conn)
	if !listen.Addr().Unmap().Is4() {
		bc = ipv6.NewPacketConn(conn)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		_ = conn.Close()
	}()
	r := &reader{m: m, conn: conn, bc: bc, parked: make(chan struct{}), resume: make(chan struct{}), done: make(chan error, 1)}
	go r.run(ctx)
	t := time.NewTicker(m.cfg.Interval)
	t.Stop()
	bufs := newBuffers()
	var runErr error
loop:
	for {
		m.mu.Lock()
		idle := len(m.order) == 0
		m.mu.Unlock()
		switch {
		case idle && m.ticking.Load():
			t.Stop()
			m.mu.Lock()
			m.lastRound = time.Time{} // no round is due while idle
			m.mu.Unlock()
			m.ticking.Store(false)
			select {
			case r.resume <- struct{}{}:
			case runErr = <-r.done:
				break loop
			}
		case !idle && !m.ticking.Load():
			// Stop the blocking reader (a read deadline in the past
			// wakes it), and read on the ticks from now on.
			m.ticking.Store(true)
			_ = conn.SetReadDeadline(time.Unix(1, 0))
			select {
			case <-r.parked:
			case runErr = <-r.done:
				break loop
			}
			_ = conn.SetReadDeadline(time.Time{})
			t.Reset(m.cfg.Interval)
		}
		if idle {
			select {
			case <-ctx.Done():
				break loop
			case <-m.peersSet:
			case runErr = <-r.done:
				break loop
			}
			continue
		}
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
			m.tick(bc, bufs)
		case <-m.peersSet:
		}
	}
	t.Stop()
	cancel()
	if runErr == nil {
		runErr = <-r.done
	}
	if runErr != nil && ctx.Err() == nil {
		return runErr
	}
	return nil
}

// tick reads what arrived since the last tick, answers it, and sends this
// round's probes, the answers and the probes in one batch.
func (m *Mesh) tick(c batchConn, b *buffers) {
	for {
		n, err := c.ReadBatch(b.rx, syscall.MSG_DONTWAIT)
		if n > 0 {
			m.handle(b.rx[:n], b, m.cfg.Interval)
		}
		if err != nil || n < len(b.rx) {
			break
		}
		b.flush(c) // a full batch: send its answers before reading on
	}
	m.round(b)
	b.flush(c)
}

// round queues one probe to every peer.
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
		if !b.add(kindReq, seq, sent.UnixNano(), ps.udpAddr) {
			return // the batch is full: the rest go next round, unsent here
		}
		ps.nextSeq++
		ps.sentAt[seq%window] = sent.UnixNano()
		ps.answered[seq%window] = false
		m.settleLocked(ps, sent)
	}
}

// handle counts the answers in ms and queues the answers to the requests;
// slack is how late the loop reads on purpose (no stall).
func (m *Mesh) handle(ms []ipv4.Message, b *buffers, slack time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for i := range ms {
		msg := &ms[i]
		kind, seq, ts, ok := decode(msg.Buffers[0][:msg.N])
		ua, isUDP := msg.Addr.(*net.UDPAddr)
		if !ok || !isUDP {
			continue
		}
		at, stamped := rxStamp(msg.OOB[:msg.NN])
		switch kind {
		case kindReq:
			if !b.add(kindResp, seq, ts, ua) {
				continue // more requests than a batch: unanswered, lost to the asker
			}
			m.answered++
			if stamped {
				m.noteStallLocked(now.Sub(stampOrNow(at, now)) - slack)
			}
		case kindResp:
			if stamped {
				m.rxStamped.Add(1)
			}
			from := ua.AddrPort()
			m.onReplyLocked(netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), seq, ts, at, now, slack)
		}
	}
}

// reader reads with blocking calls while the loop is not ticking: an agent
// without peers answers at once. Parked while the loop ticks.
type reader struct {
	m              *Mesh
	conn           *net.UDPConn
	bc             batchConn
	parked, resume chan struct{}
	done           chan error
}

func (r *reader) run(ctx context.Context) {
	b := newBuffers()
	for {
		if r.m.ticking.Load() {
			select {
			case r.parked <- struct{}{}:
			case <-ctx.Done():
				r.done <- nil
				return
			}
			select {
			case <-r.resume:
			case <-ctx.Done():
				r.done <- nil
				return
			}
			continue
		}
		n, err := r.bc.ReadBatch(b.rx, 0)
		if n > 0 {
			r.m.handle(b.rx[:n], b, 0)
			b.flush(r.bc)
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The loop starts ticking: park (top of the loop).
		case errors.Is(err, net.ErrClosed):
			r.done <- nil
			return
		default:
			r.done <- fmt.Errorf("probe: read: %w", err)
			return
		}
	}
}
