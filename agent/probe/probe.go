// Package probe runs the agent's overlay probe mesh: small UDP echo probes to
// every peer (or a configured sample) at a fixed interval, counting per peer
// what was sent, answered and lost, and the longest gap between answers.
//
// The figures are how Cutover proves a cutover did not cut the overlay: the
// coordinator resets the counters before an operation and reads them after,
// and checks that every peer answered a probe sent after the commit. The
// peer set may be replaced while the mesh runs (SetPeers: the coordinator
// picks each node's sample at Prepare).
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
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	magic = 0x43555450 // "CUTP"
	// kindReq asks for an echo, kindResp is one. Both are packetSize
	// bytes: magic, kind, seq, ts.
	kindReq  = 1
	kindResp = 2
	// kindReqResp is a probe that carries the answers to the peer's
	// probes since the last one (a kindReq and then 1 to maxRiding
	// answers, a seq and a ts each: ridingSize(n) bytes), so that two
	// agents probing each other send one datagram per pair and tick
	// instead of two. More than one rides when the peer's probes came
	// faster than this node's ticks read them (its tick drifted, a
	// stall), which an answer alone would turn back into two datagrams.
	// It goes only to a peer whose probe said it reads one (rides): an
	// agent before it decodes packetSize bytes of kinds 1 and 2 only and
	// would lose both.
	kindReqResp = 3
	packetSize  = 4 + 1 + 8 + 8
	answerSize  = 8 + 8
	maxRiding   = 4
	// rides is a flag in a probe's ts: its sender reads kindReqResp. The
	// ts is the send time in Unix nanoseconds, far below bit 62 until
	// the year 2116, and every echo returns it as it came (an agent
	// before the flag too), so the flag costs older peers nothing.
	rides = int64(1) << 62
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
	if err := CheckPeers(peers); err != nil {
		return nil, err
	}
	return peers, nil
}

// MaxPeers bounds a peer set: each peer costs about 0.6 MiB (the window of
// send times) and a probe per interval, and the DaemonSet's memory limit is
// 128 MiB. A full mesh of the largest lab (64 nodes) fits; a cluster's
// coordinator samples k peers per node instead.
const MaxPeers = 64

// CheckPeers checks a peer set: names non-empty and unique, addresses
// valid ip:port and unique (answers are matched to peers by address).
// Errors name the peer.
func CheckPeers(peers []Peer) error {
	if len(peers) > MaxPeers {
		return fmt.Errorf("%d probe peers: at most %d", len(peers), MaxPeers)
	}
	names := map[string]bool{}
	addrs := map[netip.AddrPort]string{}
	for _, p := range peers {
		switch {
		case p.Name == "":
			return fmt.Errorf("probe peer at %s: empty name", p.Addr)
		case names[p.Name]:
			return fmt.Errorf("probe peer %q: listed twice", p.Name)
		case !p.Addr.IsValid() || p.Addr.Port() == 0 || p.Addr.Addr().IsUnspecified():
			return fmt.Errorf("probe peer %q: address %q: want a unicast ip:port", p.Name, p.Addr)
		}
		if other, ok := addrs[unmap(p.Addr)]; ok {
			return fmt.Errorf("probe peer %q: address %s is also peer %q's", p.Name, p.Addr, other)
		}
		names[p.Name] = true
		addrs[unmap(p.Addr)] = p.Name
	}
	return nil
}

func unmap(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }

// Config configures a Mesh.
type Config struct {
	// Listen is the overlay address and port probes are sent from and
	// answered on. It may be left zero when the address is not known yet
	// and given to RunAt instead.
	Listen netip.AddrPort
	// Peers is the initial peer set (SetPeers replaces it).
	Peers []Peer
	// Interval between two probes to the same peer (down to 1 ms).
	Interval time.Duration
	// Timeout after which an unanswered probe counts as lost.
	Timeout time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Validate checks the configuration; errors name the field.
func (c Config) Validate() error {
	if c.Listen != (netip.AddrPort{}) && !c.Listen.IsValid() {
		return errors.New("probe listen address: must be ip:port on the overlay")
	}
	if err := CheckPeers(c.Peers); err != nil {
		return err
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
	// LongestGapFrom is when that gap began (the answer before it, or the
	// reset): it places the worst outage in an operation's phases.
	LongestGapFrom time.Time

	// The times below are of the mesh's clock (the agent's wall clock) and
	// survive a counter reset: they are facts, not counts. Zero: never.

	// Since is when probing this peer began (the mesh started with it, or
	// SetPeers added it).
	Since time.Time
	// LastAnswer is when the latest answer arrived.
	LastAnswer time.Time
	// LastAnsweredSent is when the latest probe that was answered was
	// sent: an answer to a probe sent after an instant proves the round
	// trip worked after it, whatever was in flight before.
	LastAnsweredSent time.Time
	// Losses are the Lost probes as runs of consecutive sends, oldest
	// first: what places each lost probe in an operation's phases, where
	// LongestGapFrom places only the longest wait (a pair whose answers
	// were delayed in one phase and lost in another waited longest in the
	// first). Their counts add up to Lost.
	Losses []LossRun
}

// LossRun is a run of lost probes to one peer: consecutive sends, none
// answered in time, First and Last the first and the last one's send time
// (the mesh's clock).
type LossRun struct {
	First, Last time.Time
	Count       uint64
}

// maxLossRuns bounds a peer's runs between two resets. Past it the last
// run takes every further loss: its span then covers answered probes
// too, and the count stays exact.
const maxLossRuns = 64

// lossRun is LossRun in the mesh's own form (send times as UnixNano).
type lossRun struct {
	first, last int64
	count       uint64
}

type peerState struct {
	peer     Peer
	nextSeq  uint64
	settled  uint64 // every seq below this is counted as received or lost
	base     uint64 // the first seq the counters cover (after the last reset)
	sentAt   [window]int64
	answered [window]bool
	received uint64
	lost     uint64
	// Totals never reset, for Prometheus counters.
	totalReceived, totalLost uint64
	since                    time.Time
	lastReply                time.Time
	lastAnsweredSent         int64     // UnixNano; 0: none
	gapFrom                  time.Time // start of the current gap window (reset or last answer)
	longest                  time.Duration
	longestFrom              time.Time // start of the longest gap
	// runs are the lost probes since the last reset (Stats.Losses);
	// runNext is the seq that would extend the last run.
	runs    []lossRun
	runNext uint64
}

// noteLossLocked adds the lost probe seq, sent at sentAt, to ps.runs.
func (ps *peerState) noteLossLocked(seq uint64, sentAt int64) {
	if n := len(ps.runs); n > 0 && (seq == ps.runNext || n == maxLossRuns) {
		r := &ps.runs[n-1]
		r.last, r.count = max(r.last, sentAt), r.count+1
	} else {
		ps.runs = append(ps.runs, lossRun{first: sentAt, last: sentAt, count: 1})
	}
	ps.runNext = seq + 1
}

// unnoteLossLocked takes back a probe counted lost, sent at sentAt, whose
// answer turned out to have arrived in time. The run keeps its span.
func (ps *peerState) unnoteLossLocked(sentAt int64) {
	for i := range ps.runs {
		if r := &ps.runs[i]; r.first <= sentAt && sentAt <= r.last {
			if r.count--; r.count == 0 {
				ps.runs = slices.Delete(ps.runs, i, i+1)
				ps.runNext = 0 // the seq that would extend the last run may be gone
			}
			return
		}
	}
}

// Mesh is a running probe mesh. Its methods are safe for concurrent use.
type Mesh struct {
	cfg Config
	now func() time.Time
	mu  sync.Mutex
	// peers and order are replaced as a whole by SetPeers, under mu; a
	// peerState's fields are read and written under mu.
	peers map[netip.AddrPort]*peerState
	order []*peerState
	// pacer wakes the RunAt loop (under mu; nil while none runs) when
	// SetPeers changes whether it ticks.
	pacer *pacer
	// ticking says the RunAt loop reads on its ticks (batch.go); the
	// blocking reader is parked meanwhile.
	ticking atomic.Bool
	// answered counts the probes this node answered for others, rode
	// those of them whose answer rode in a probe.
	answered, rode uint64
	// rxStamped counts answers that carried the kernel's receive stamp.
	rxStamped atomic.Uint64
	// stall is the longest this agent fell behind its own mesh since the
	// last reset (under mu): a round of probes sent that long after it was
	// due, or a packet (a request to answer, an answer) read that long
	// after the kernel received it. A machine that did not run the agent
	// for 40 ms makes every pair to and from it show a gap about 40 ms
	// longer than the overlay had; the report gives it beside the gaps so
	// that such a gap is not read as the overlay's. lastRound is when the
	// previous round was sent (zero after the ticker was stopped).
	stall     time.Duration
	lastRound time.Time
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
	if err := m.SetPeers(cfg.Peers); err != nil {
		return nil, err
	}
	return m, nil
}

// SetPeers replaces the peer set by peers (checked with CheckPeers). A peer
// already probed under the same name and address keeps its counters and
// probes in flight, so replaying the same set changes nothing; every other
// peer starts from zero, and peers not in the set are no longer probed.
func (m *Mesh) SetPeers(peers []Peer) error {
	if err := CheckPeers(peers); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	byAddr := make(map[netip.AddrPort]*peerState, len(peers))
	order := make([]*peerState, 0, len(peers))
	for _, p := range peers {
		p.Addr = unmap(p.Addr)
		ps := m.peers[p.Addr]
		if ps == nil || ps.peer.Name != p.Name {
			ps = &peerState{peer: p, gapFrom: now, since: now}
		}
		byAddr[p.Addr] = ps
		order = append(order, ps)
	}
	m.peers, m.order = byAddr, order
	if m.pacer != nil {
		m.pacer.wake()
	}
	return nil
}

// Peers returns the current peer set, in the order it was given.
func (m *Mesh) Peers() []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Peer, len(m.order))
	for i, ps := range m.order {
		out[i] = ps.peer
	}
	return out
}

// Timeout is the configured probe timeout.
func (m *Mesh) Timeout() time.Duration { return m.cfg.Timeout }

// Interval is the configured probe interval.
func (m *Mesh) Interval() time.Duration { return m.cfg.Interval }

// Run answers and sends probes on Config.Listen until ctx ends.
func (m *Mesh) Run(ctx context.Context) error { return m.RunAt(ctx, m.cfg.Listen) }

// onReply counts an answer. arrived is the kernel's receive stamp (zero:
// none); the mesh's clock is used instead when there is none or it is not
// the same clock (a test's fake), i.e. more than a second off.
//
// The answer's time is when it arrived, not when it was read: an agent
// busy elsewhere (its commit, a GC, the CPU given to other processes) reads
// a burst of answers late, which is no gap in the overlay. For the same
// reason an answer that arrived within the timeout but was read after the
// sender had already settled its probe as lost is moved back to received.
func (m *Mesh) onReply(from netip.AddrPort, seq uint64, sentAt int64, arrived time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onReplyLocked(from, seq, sentAt, arrived, m.now(), 0)
}

// onReplyLocked is onReply under m.mu, read at now; slack is how late the
// mesh reads on purpose (a tick's batch reads what arrived since the last
// tick): no stall.
func (m *Mesh) onReplyLocked(from netip.AddrPort, seq uint64, sentAt int64, arrived, now time.Time, slack time.Duration) {
	arrived = stampOrNow(arrived, now)
	m.noteStallLocked(now.Sub(arrived) - slack)
	ps := m.peers[from]
	if ps == nil || seq < ps.base || seq >= ps.nextSeq || ps.nextSeq-seq >= window {
		return // unknown peer, before the last reset, forged, or out of the window
	}
	slot := seq % window
	if ps.sentAt[slot] != sentAt || ps.answered[slot] {
		return // duplicate or stale
	}
	if dropAnswer(seq) {
		return // test-only fault (faultinject.go): never in a shipped agent
	}
	if seq < ps.settled {
		// Counted lost already: only an answer that arrived in time is
		// taken back (the Prometheus totals are counters and keep it).
		if arrived.UnixNano()-sentAt > int64(m.cfg.Timeout) || ps.lost == 0 {
			return
		}
		ps.lost--
		ps.received++
		ps.unnoteLossLocked(sentAt)
	}
	ps.answered[slot] = true
	if arrived.After(ps.gapFrom) {
		m.noteGapLocked(ps, arrived)
		ps.gapFrom = arrived
	}
	if arrived.After(ps.lastReply) {
		ps.lastReply = arrived
	}
	ps.lastAnsweredSent = max(ps.lastAnsweredSent, sentAt)
}

// stampOrNow is a kernel receive stamp, or now when there is none or it is
// not of now's clock (a test's fake: more than a second off).
func stampOrNow(at, now time.Time) time.Time {
	if at.IsZero() || at.After(now.Add(time.Second)) || at.Before(now.Add(-time.Second)) {
		return now
	}
	return at
}

// noteStallLocked records d, how late the agent did something the mesh
// had due: a round sent after its interval, a packet read after the kernel
// received it (through stampOrNow).
func (m *Mesh) noteStallLocked(d time.Duration) { m.stall = max(m.stall, d) }

func (m *Mesh) noteGapLocked(ps *peerState, now time.Time) {
	if gap := now.Sub(ps.gapFrom); gap > ps.longest {
		ps.longest, ps.longestFrom = gap, ps.gapFrom
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
		if ps.answered[slot] || hiddenLoss() { // hiddenLoss: test-only fault (faultinject.go)
			ps.received++
			ps.totalReceived++
		} else {
			ps.lost++
			ps.totalLost++
			ps.noteLossLocked(ps.settled, ps.sentAt[slot])
		}
		ps.settled++
	}
}

// Stats returns every peer's counters, sorted by peer name. With reset the
// counters start again from zero (probes in flight are forgotten).
func (m *Mesh) Stats(reset bool) []Stats {
	st, _ := m.Snapshot(reset)
	return st
}

// Snapshot is Stats with how far the agent fell behind its mesh (Mesh.stall)
// over the same span, both reset together.
func (m *Mesh) Snapshot(reset bool) ([]Stats, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	stall := m.stall
	if reset {
		m.stall = 0
	}
	out := make([]Stats, 0, len(m.order))
	for _, ps := range m.order {
		m.settleLocked(ps, now)
		longest, from := ps.longest, ps.longestFrom
		// An ongoing outage is a gap too, even before the next answer.
		if ps.settled > 0 && ps.lost > 0 {
			if g := now.Sub(ps.gapFrom) - m.cfg.Timeout; g > longest {
				longest, from = g, ps.gapFrom
			}
		}
		st := Stats{
			Peer: ps.peer.Name, Address: ps.peer.Addr.String(),
			Sent: ps.received + ps.lost, Received: ps.received, Lost: ps.lost,
			LongestGap: longest, LongestGapFrom: from, Since: ps.since, LastAnswer: ps.lastReply,
		}
		if ps.lastAnsweredSent != 0 {
			st.LastAnsweredSent = time.Unix(0, ps.lastAnsweredSent)
		}
		for _, r := range ps.runs {
			st.Losses = append(st.Losses, LossRun{First: time.Unix(0, r.first), Last: time.Unix(0, r.last), Count: r.count})
		}
		out = append(out, st)
		if reset {
			ps.settled, ps.base = ps.nextSeq, ps.nextSeq
			ps.received, ps.lost, ps.longest = 0, 0, 0
			ps.gapFrom, ps.longestFrom = now, time.Time{}
			ps.runs, ps.runNext = ps.runs[:0], 0
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out, stall
}

// ridingSize is the length of a kindReqResp with n answers.
func ridingSize(n int) int { return packetSize + n*answerSize }

// echo is one answer: the seq and ts of the probe it answers.
type echo struct {
	seq uint64
	ts  int64
}

// packet is one decoded datagram: a probe (seq, ts), an answer, or a
// probe with answers riding (ans[:nAns]).
type packet struct {
	kind byte
	seq  uint64
	ts   int64
	nAns int
	ans  [maxRiding]echo
}

// encode writes p into b (packetSize bytes, ridingSize(p.nAns) for
// kindReqResp) and returns its length.
func encode(b []byte, p packet) int {
	binary.BigEndian.PutUint32(b[0:4], magic)
	b[4] = p.kind
	binary.BigEndian.PutUint64(b[5:13], p.seq)
	binary.BigEndian.PutUint64(b[13:21], uint64(p.ts))
	if p.kind != kindReqResp {
		return packetSize
	}
	for i, e := range p.ans[:p.nAns] {
		at := packetSize + i*answerSize
		binary.BigEndian.PutUint64(b[at:at+8], e.seq)
		binary.BigEndian.PutUint64(b[at+8:at+16], uint64(e.ts))
	}
	return ridingSize(p.nAns)
}

func decode(b []byte) (packet, bool) {
	if len(b) < packetSize || binary.BigEndian.Uint32(b[0:4]) != magic {
		return packet{}, false
	}
	p := packet{kind: b[4], seq: binary.BigEndian.Uint64(b[5:13]), ts: int64(binary.BigEndian.Uint64(b[13:21]))}
	rest := len(b) - packetSize
	switch {
	case (p.kind == kindReq || p.kind == kindResp) && rest == 0:
	case p.kind == kindReqResp && rest > 0 && rest%answerSize == 0 && rest/answerSize <= maxRiding:
		p.nAns = rest / answerSize
		for i := range p.nAns {
			at := packetSize + i*answerSize
			p.ans[i] = echo{binary.BigEndian.Uint64(b[at : at+8]), int64(binary.BigEndian.Uint64(b[at+8 : at+16]))}
		}
	default:
		return packet{}, false
	}
	return p, true
}
