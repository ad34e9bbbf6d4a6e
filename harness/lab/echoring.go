package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
)

// EchoRing is a meter independent of the agents' probe mesh (agent/probe):
// its own UDP sockets on the nodes' overlay addresses (port EchoRingPort),
// its own packet format, its own goroutines in the test process, sending
// over the same ordered pairs at the same interval. It exists to check the
// mesh ("a meter that tells the truth"): both see the same
// network, so the mesh must not report much more loss than the ring.
//
// A ring request is answered whenever it arrives, and an answer counts
// whenever it arrives before Stop has drained: the ring has no timeout, so
// nothing it calls lost was delivered. Its receive buffers are 4 MiB
// (SO_RCVBUFFORCE) so a stall of the test process does not drop answers.
type EchoRing struct {
	interval time.Duration
	nodes    []*ringNode
	stop     chan struct{}
	wg       sync.WaitGroup
	started  time.Time
}

// EchoRingPort is the ring's UDP port on every overlay address (the mesh's
// is 9445).
const EchoRingPort = 9446

const (
	ringMagic  = 0x52494e47 // "RING"
	ringReq    = 1
	ringResp   = 2
	ringPacket = 4 + 1 + 8
)

type ringNode struct {
	name  string
	conn  *net.UDPConn
	mu    sync.Mutex
	peers []*ringPeer
	by    map[netip.AddrPort]*ringPeer
}

type ringPeer struct {
	name     string
	addr     netip.AddrPort
	sentAt   []time.Time // by seq
	answerAt []time.Time // by seq; zero: no answer
}

// RingPair is one ordered pair's ring figures: From sent Sent requests to
// To, Lost of them got no answer; LongestGap is the longest time between
// two answers (from the first send); LostFrom/LostTo bracket the lost
// probes' send times, relative to the ring's start (zero when none lost).
type RingPair struct {
	From       string        `json:"from"`
	To         string        `json:"to"`
	Sent       uint64        `json:"sent"`
	Lost       uint64        `json:"lost"`
	LongestGap time.Duration `json:"longest_gap_ns"`
	LostFrom   time.Duration `json:"lost_from_ns"`
	LostTo     time.Duration `json:"lost_to_ns"`
}

// StartEchoRing starts the ring on the lab's nodes: every node sends to
// the k peers ProbePeersOf picks (the pairs the agents' mesh probes when
// the lab runs with ProbePeers k) every interval. Stop it with Stop.
func (l *Lab) StartEchoRing(interval time.Duration, k int) (*EchoRing, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("echo ring: interval %v: must be positive", interval)
	}
	nodes := l.Nodes()
	r := &EchoRing{interval: interval, stop: make(chan struct{})}
	closeAll := func() {
		for _, rn := range r.nodes {
			_ = rn.conn.Close()
		}
	}
	for _, n := range nodes {
		var conn *net.UDPConn
		err := netns.Do(n.Netns, func() error {
			// The socket stays in the namespace after the thread leaves.
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(n.OverlayIP, EchoRingPort)))
			conn = c
			return err
		})
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("echo ring: node %s: listen %s:%d: %w", n.Name, n.OverlayIP, EchoRingPort, err)
		}
		if err := forceRcvBuf(conn, 4<<20); err != nil {
			_ = conn.Close()
			closeAll()
			return nil, fmt.Errorf("echo ring: node %s: %w", n.Name, err)
		}
		rn := &ringNode{name: n.Name, conn: conn, by: map[netip.AddrPort]*ringPeer{}}
		for _, p := range ProbePeersOf(n, nodes, k) {
			rp := &ringPeer{name: p.Name, addr: netip.AddrPortFrom(p.OverlayIP, EchoRingPort)}
			rn.peers = append(rn.peers, rp)
			rn.by[rp.addr] = rp
		}
		r.nodes = append(r.nodes, rn)
	}
	r.started = time.Now()
	for _, rn := range r.nodes {
		r.wg.Add(1)
		go func() { defer r.wg.Done(); rn.receive() }()
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.send() }()
	return r, nil
}

func forceRcvBuf(c *net.UDPConn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_RCVBUFFORCE %d: %w", n, serr)
	}
	return nil
}

// send is one goroutine for every node: a ticker, and per tick one request
// to every pair. A late tick is late for every pair alike; a dropped tick
// sends nothing, so it is neither sent nor lost.
func (r *EchoRing) send() {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	var buf [ringPacket]byte
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		for _, rn := range r.nodes {
			for _, rp := range rn.peers {
				rn.mu.Lock()
				seq := uint64(len(rp.sentAt))
				now := time.Now()
				rp.sentAt = append(rp.sentAt, now)
				rp.answerAt = append(rp.answerAt, time.Time{})
				rn.mu.Unlock()
				binary.BigEndian.PutUint32(buf[0:4], ringMagic)
				buf[4] = ringReq
				binary.BigEndian.PutUint64(buf[5:13], seq)
				_, _ = rn.conn.WriteToUDPAddrPort(buf[:], rp.addr)
			}
		}
	}
}

func (rn *ringNode) receive() {
	var buf [1500]byte
	for {
		n, from, err := rn.conn.ReadFromUDPAddrPort(buf[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if n != ringPacket || binary.BigEndian.Uint32(buf[0:4]) != ringMagic {
			continue
		}
		seq := binary.BigEndian.Uint64(buf[5:13])
		switch buf[4] {
		case ringReq:
			buf[4] = ringResp
			_, _ = rn.conn.WriteToUDPAddrPort(buf[:ringPacket], from)
		case ringResp:
			now := time.Now()
			rn.mu.Lock()
			rp := rn.by[netip.AddrPortFrom(from.Addr().Unmap(), from.Port())]
			if rp != nil && seq < uint64(len(rp.answerAt)) && rp.answerAt[seq].IsZero() {
				rp.answerAt[seq] = now
			}
			rn.mu.Unlock()
		}
	}
}

// Stop stops sending, waits drain for answers in flight and closes the
// sockets; Pairs then reads the figures.
func (r *EchoRing) Stop(drain time.Duration) {
	close(r.stop)
	time.Sleep(drain)
	for _, rn := range r.nodes {
		_ = rn.conn.Close()
	}
	r.wg.Wait()
}

// Pairs returns every pair's figures over the probes sent in [from, to)
// (zero times: unbounded), sorted by From then To. The longest gap is the
// longest time between two answers to probes of the window, or from the
// window's first probe to its first answer.
func (r *EchoRing) Pairs(from, to time.Time) []RingPair {
	var out []RingPair
	for _, rn := range r.nodes {
		rn.mu.Lock()
		for _, rp := range rn.peers {
			p := RingPair{From: rn.name, To: rp.name}
			var last time.Time
			for seq, sent := range rp.sentAt {
				if (!from.IsZero() && sent.Before(from)) || (!to.IsZero() && !sent.Before(to)) {
					continue
				}
				p.Sent++
				if last.IsZero() {
					last = sent
				}
				if at := rp.answerAt[seq]; !at.IsZero() {
					if at.After(last) {
						p.LongestGap = max(p.LongestGap, at.Sub(last))
						last = at
					}
					continue
				}
				p.Lost++
				off := sent.Sub(r.started)
				if p.LostFrom == 0 {
					p.LostFrom = off
				}
				p.LostTo = off
			}
			out = append(out, p)
		}
		rn.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].From != out[j].From {
			return out[i].From < out[j].From
		}
		return out[i].To < out[j].To
	})
	return out
}

// Started is when the ring began sending.
func (r *EchoRing) Started() time.Time { return r.started }
