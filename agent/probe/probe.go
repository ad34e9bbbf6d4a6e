// Package probe runs the agent's overlay probe mesh: small UDP echo probes to
// every peer (or a configured sample) at a fixed interval, counting per peer
// what was sent, answered and lost, and the longest gap between answers.
//
// The figures are how Cutover proves a cutover did not cut the overlay: the
// coordinator resets the counters before an operation and reads them after.
// Probes are round trips (A asks, B echoes), so one agent alone knows the
// health of the pair in both directions without comparing clocks.
//
// The package owns one UDP socket on the node's overlay address; it never
// touches the dataplane and must not be used to change anything.
package probe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"
)

const (
	magic      = 0x43555450 // "CUTP"
	kindReq    = 1
	kindResp   = 2
	packetSize = 4 + 1 + 8 + 8
	// window is how many probes per peer are remembered; at 1 ms that is
	// 65 s, far longer than any answer can take.
	window = 1 << 16
)

// Peer is one probe target.
type Peer struct {
	Name string
	Addr netip.AddrPort
}

// ParsePeers parses "name=ip:port,name=ip:port". Errors name the entry.
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("probe peer %q: want name=ip:port", item)
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("probe peer %q: address %q: %w", name, addr, err)
		}
		if seen[name] {
			return nil, fmt.Errorf("probe peer %q: listed twice", name)
		}
		seen[name] = true
		peers = append(peers, Peer{Name: name, Addr: ap})
	}
	return peers, nil
}

// Config configures a Mesh.
type Config struct {
	// Listen is the overlay address and port probes are sent from and
	// answered on.
	Listen netip.AddrPort
	Peers  []Peer
	// Interval between two probes to the same peer (down to 1 ms).
	Interval time.Duration
	// Timeout after which an unanswered probe counts as lost.
	Timeout time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Validate checks the configuration; errors name the field.
func (c Config) Validate() error {
	if !c.Listen.IsValid() {
		return errors.New("probe listen address: must be ip:port on the overlay")
	}
	if c.Interval < time.Millisecond || c.Interval > time.Minute {
		return fmt.Errorf("probe interval %v: must be between 1ms and 1m", c.Interval)
	}
	if c.Timeout < c.Interval {
		return fmt.Errorf("probe timeout %v: must be at least the interval %v", c.Timeout, c.Interval)
	}
	return nil
}

// Stats are one peer's counters.
type Stats struct {
	Peer       string
	Address    string
	Sent       uint64 // probes sent whose fate is known (answered or timed out)
	Received   uint64
	Lost       uint64
	LongestGap time.Duration // longest time between two answers, including an ongoing gap
}

type peerState struct {
	peer     Peer
	nextSeq  uint64
	settled  uint64 // every seq below this is counted as received or lost
	sentAt   [window]int64
	answered [window]bool
	received uint64
	lost     uint64
	// Totals never reset, for Prometheus counters.
	totalReceived, totalLost uint64
	lastReply                time.Time
	gapFrom                  time.Time // start of the current gap window (reset or last answer)
	longest                  time.Duration
}

// Mesh is a running probe mesh.
type Mesh struct {
	cfg   Config
	now   func() time.Time
	mu    sync.Mutex
	peers map[netip.AddrPort]*peerState
	order []*peerState
	conn  *net.UDPConn
	// Answered counts echo requests this node answered for others.
	answered uint64
}

// New returns a mesh; Run starts it.
func New(cfg Config) (*Mesh, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = max(100*time.Millisecond, 10*cfg.Interval)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Mesh{cfg: cfg, now: cfg.Now, peers: map[netip.AddrPort]*peerState{}}
	if m.now == nil {
		m.now = time.Now
	}
	start := m.now()
	for _, p := range cfg.Peers {
		ps := &peerState{peer: p, gapFrom: start}
		m.peers[p.Addr] = ps
		m.order = append(m.order, ps)
	}
	return m, nil
}

// Interval is the configured probe interval.
func (m *Mesh) Interval() time.Duration { return m.cfg.Interval }

// Run answers and sends probes until ctx ends.
func (m *Mesh) Run(ctx context.Context) error {
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(m.cfg.Listen))
	if err != nil {
		return fmt.Errorf("probe: listen %s: %w", m.cfg.Listen, err)
	}
	m.mu.Lock()
	m.conn = conn
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		_ = conn.Close()
	}()
	errc := make(chan error, 1)
	go func() { errc <- m.receive(conn) }()
	if len(m.order) > 0 {
		t := time.NewTicker(m.cfg.Interval)
		defer t.Stop()
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-t.C:
				m.sendRound(conn)
			}
		}
	} else {
		<-ctx.Done()
	}
	cancel()
	if err := <-errc; err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func (m *Mesh) sendRound(conn *net.UDPConn) {
	var buf [packetSize]byte
	for _, ps := range m.order {
		m.mu.Lock()
		seq := ps.nextSeq
		ps.nextSeq++
		sent := m.now()
		ps.sentAt[seq%window] = sent.UnixNano()
		ps.answered[seq%window] = false
		m.settleLocked(ps, sent)
		m.mu.Unlock()
		encode(buf[:], kindReq, seq, sent.UnixNano())
		// A send error (no route while the overlay is down, say) is a lost
		// probe, which the counters already show; nothing else to do.
		_, _ = conn.WriteToUDPAddrPort(buf[:], ps.peer.Addr)
	}
}

func (m *Mesh) receive(conn *net.UDPConn) error {
	var buf [1500]byte
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("probe: read: %w", err)
		}
		kind, seq, ts, ok := decode(buf[:n])
		if !ok {
			continue
		}
		switch kind {
		case kindReq:
			encode(buf[:packetSize], kindResp, seq, ts)
			_, _ = conn.WriteToUDPAddrPort(buf[:packetSize], from)
			m.mu.Lock()
			m.answered++
			m.mu.Unlock()
		case kindResp:
			m.onReply(netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), seq, ts)
		}
	}
}

func (m *Mesh) onReply(from netip.AddrPort, seq uint64, sentAt int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.peers[from]
	if ps == nil || seq < ps.settled || seq >= ps.nextSeq {
		return // unknown peer, already counted (late or after a reset), or forged
	}
	slot := seq % window
	if ps.sentAt[slot] != sentAt || ps.answered[slot] {
		return // duplicate or stale
	}
	ps.answered[slot] = true
	now := m.now()
	m.noteGapLocked(ps, now)
	ps.lastReply = now
	ps.gapFrom = now
}

func (m *Mesh) noteGapLocked(ps *peerState, now time.Time) {
	if gap := now.Sub(ps.gapFrom); gap > ps.longest {
		ps.longest = gap
	}
}

// settleLocked moves every probe older than the timeout into received or lost.
func (m *Mesh) settleLocked(ps *peerState, now time.Time) {
	cutoff := now.Add(-m.cfg.Timeout).UnixNano()
	for ps.settled < ps.nextSeq {
		slot := ps.settled % window
		if ps.sentAt[slot] > cutoff && ps.nextSeq-ps.settled < window {
			break
		}
		if ps.answered[slot] {
			ps.received++
			ps.totalReceived++
		} else {
			ps.lost++
			ps.totalLost++
		}
		ps.settled++
	}
}

// Stats returns every peer's counters, sorted by peer name. With reset the
// counters start again from zero (probes in flight are forgotten).
func (m *Mesh) Stats(reset bool) []Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]Stats, 0, len(m.order))
	for _, ps := range m.order {
		m.settleLocked(ps, now)
		longest := ps.longest
		// An ongoing outage is a gap too, even before the next answer.
		if ps.settled > 0 && ps.lost > 0 {
			if g := now.Sub(ps.gapFrom) - m.cfg.Timeout; g > longest {
				longest = g
			}
		}
		out = append(out, Stats{
			Peer: ps.peer.Name, Address: ps.peer.Addr.String(),
			Sent: ps.received + ps.lost, Received: ps.received, Lost: ps.lost,
			LongestGap: longest,
		})
		if reset {
			ps.settled = ps.nextSeq
			ps.received, ps.lost, ps.longest = 0, 0, 0
			ps.gapFrom = now
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}

func encode(b []byte, kind byte, seq uint64, ts int64) {
	binary.BigEndian.PutUint32(b[0:4], magic)
	b[4] = kind
	binary.BigEndian.PutUint64(b[5:13], seq)
	binary.BigEndian.PutUint64(b[13:21], uint64(ts))
}

func decode(b []byte) (kind byte, seq uint64, ts int64, ok bool) {
	if len(b) != packetSize || binary.BigEndian.Uint32(b[0:4]) != magic {
		return 0, 0, 0, false
	}
	kind = b[4]
	if kind != kindReq && kind != kindResp {
		return 0, 0, 0, false
	}
	return kind, binary.BigEndian.Uint64(b[5:13]), int64(binary.BigEndian.Uint64(b[13:21])), true
}
