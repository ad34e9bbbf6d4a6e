package probe

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// Two agents that probe each other put every answer in their own next
// probe: one datagram per pair and tick instead of two, and the figures
// are those of answers sent alone (all answered, no gap beyond a few
// intervals).
func TestAnswersRideInProbes(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:31471")
	b := netip.MustParseAddrPort("127.0.0.1:31472")
	ma, cancelA, doneA := startMesh(t, Config{Listen: a, Peers: []Peer{{Name: "b", Addr: b}}, Interval: 2 * time.Millisecond, Timeout: 50 * time.Millisecond})
	defer stop(t, cancelA, doneA)
	mb, cancelB, doneB := startMesh(t, Config{Listen: b, Peers: []Peer{{Name: "a", Addr: a}}, Interval: 2 * time.Millisecond, Timeout: 50 * time.Millisecond})
	defer stop(t, cancelB, doneB)
	time.Sleep(100 * time.Millisecond)
	ma.Stats(true)
	mb.Stats(true)
	_, rodeA0 := answers(ma)
	_, rodeB0 := answers(mb)
	time.Sleep(400 * time.Millisecond)
	for name, m := range map[string]*Mesh{"a": ma, "b": mb} {
		st := m.Stats(false)
		if len(st) != 1 || st[0].Sent < 100 || st[0].Received+2 < st[0].Sent || st[0].LongestGap > 40*time.Millisecond {
			t.Errorf("%s: %+v: want ≥ 100 probes answered, the last two at most in flight, gaps of a few 2 ms intervals", name, st)
		}
	}
	answeredA, rodeA := answers(ma)
	answeredB, rodeB := answers(mb)
	// Each answers the other's probes, all riding but for the first (the
	// peer's probe that came before this mesh probed it) and those of a
	// tick that read more than maxRiding of them.
	if rodeA-rodeA0 < 100 || rodeB-rodeB0 < 100 || 20*rodeA < 19*answeredA || 20*rodeB < 19*answeredB {
		t.Errorf("answers riding: a %d of %d, b %d of %d; want ≥ 100 each in the window and ≥ 95 %%", rodeA-rodeA0, answeredA, rodeB-rodeB0, answeredB)
	}
}

// A rolling upgrade mixes agents: one that does not read riding answers
// (it decodes 21 bytes of kinds 1 and 2, and drops the rest) must get
// every answer alone, and its answers must count here, though each side
// probes the other.
func TestRidingAnswersSpareOlderAgents(t *testing.T) {
	got := olderAgentExchange(t)
	if got.oldSent < 100 || got.oldAnswered < got.oldSent {
		t.Errorf("the older agent had %d of its %d probes answered: it cannot read riding answers, so every answer must go alone", got.oldAnswered, got.oldSent)
	}
	if got.rode != 0 {
		t.Errorf("%d answers rode to an agent whose probes never said it reads them", got.rode)
	}
	if st := got.stats; len(st) != 1 || st[0].Sent < 100 || st[0].Received+2 < st[0].Sent {
		t.Errorf("this mesh's probes to the older agent: %+v, want all answered", st)
	}
	if !got.flagged {
		t.Error("this mesh's probes do not say it reads riding answers: no newer peer would send one")
	}
}

func answers(m *Mesh) (answered, rode uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.answered, m.rode
}

type exchange struct {
	oldSent, oldAnswered uint64
	rode                 uint64
	stats                []Stats
	flagged              bool // a probe of this mesh carried the rides flag
}

// olderAgentExchange runs this mesh against an agent of the protocol
// before riding answers for 400 ms, each probing the other every 2 ms.
func olderAgentExchange(t *testing.T) exchange {
	t.Helper()
	a := netip.MustParseAddrPort("127.0.0.1:31473")
	old := netip.MustParseAddrPort("127.0.0.1:31474")
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(old))
	if err != nil {
		t.Skipf("no UDP socket on loopback: %v", err)
	}
	ma, cancelA, doneA := startMesh(t, Config{Listen: a, Peers: []Peer{{Name: "old", Addr: old}}, Interval: 2 * time.Millisecond, Timeout: 50 * time.Millisecond})
	time.Sleep(50 * time.Millisecond) // its socket is bound: a probe before would be lost
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var (
		mu       sync.Mutex
		ex       exchange
		answered = map[uint64]bool{}
		wg       sync.WaitGroup
	)
	wg.Add(2)
	go func() { // the older agent's prober
		defer wg.Done()
		var buf [packetSize]byte
		for seq := uint64(0); ctx.Err() == nil; seq++ {
			binary.BigEndian.PutUint32(buf[0:4], magic)
			buf[4] = kindReq
			binary.BigEndian.PutUint64(buf[5:13], seq)
			binary.BigEndian.PutUint64(buf[13:21], uint64(time.Now().UnixNano()))
			if _, err := conn.WriteToUDPAddrPort(buf[:], a); err == nil {
				mu.Lock()
				ex.oldSent++
				mu.Unlock()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	readCtx, stopReading := context.WithCancel(context.Background())
	defer stopReading()
	go func() { // the older agent's reader: its decode, its echo
		defer wg.Done()
		buf := make([]byte, 1500)
		for readCtx.Err() == nil {
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil || n != packetSize || binary.BigEndian.Uint32(buf[0:4]) != magic {
				continue
			}
			switch buf[4] {
			case kindReq:
				mu.Lock()
				ex.flagged = ex.flagged || int64(binary.BigEndian.Uint64(buf[13:21]))&rides != 0
				mu.Unlock()
				buf[4] = kindResp
				_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
			case kindResp:
				mu.Lock()
				answered[binary.BigEndian.Uint64(buf[5:13])] = true
				mu.Unlock()
			}
		}
	}()
	// Read while the older agent still answers: the probes settled then
	// (sent more than the timeout before) all had their chance.
	time.Sleep(450 * time.Millisecond)
	ex.stats = ma.Stats(false)
	<-ctx.Done()
	time.Sleep(60 * time.Millisecond) // the answers to its last probes
	stopReading()
	wg.Wait()
	stop(t, cancelA, doneA)
	_ = conn.Close()
	mu.Lock()
	defer mu.Unlock()
	ex.oldAnswered = uint64(len(answered))
	_, ex.rode = answers(ma)
	return ex
}

// A peer's probes that came faster than this node's ticks read them (its
// tick drifted, this node stalled) all ride in the next probe to it, up
// to maxRiding; only those beyond go alone. A probe from an agent that
// does not read riding answers (no flag) is answered alone.
func TestProbesOfOneTickRideTogether(t *testing.T) {
	peer := netip.MustParseAddrPort("127.0.0.2:9445")
	old := netip.MustParseAddrPort("127.0.0.3:9445")
	m, err := New(Config{Peers: []Peer{{Name: "p", Addr: peer}, {Name: "old", Addr: old}}, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var in []msg
	for seq := range uint64(maxRiding + 1) {
		buf := make([]byte, packetSize)
		encode(buf, packet{kind: kindReq, seq: seq, ts: int64(100+seq) | rides})
		in = append(in, msg{buf: buf, n: packetSize, addr: peer})
	}
	buf := make([]byte, packetSize)
	encode(buf, packet{kind: kindReq, seq: 7, ts: 107})
	in = append(in, msg{buf: buf, n: packetSize, addr: old})
	b := newBuffers()
	m.handle(in, b, 0, true)
	m.round(b)
	for _, r := range b.rides { // answerRides without the socket
		if !r.taken {
			b.add(packet{kind: kindResp, seq: r.seq, ts: r.ts}, r.to)
		}
	}
	var got []string
	for _, d := range b.tx {
		p, ok := decode(d.buf[:d.n])
		if !ok {
			t.Fatalf("undecodable datagram to %s", d.addr)
		}
		s := fmt.Sprintf("%s kind %d", d.addr, p.kind)
		for _, e := range p.ans[:p.nAns] {
			s += fmt.Sprintf(" %d", e.seq)
		}
		if p.kind == kindResp {
			s += fmt.Sprintf(" %d", p.seq)
		}
		got = append(got, s)
	}
	want := []string{
		"127.0.0.2:9445 kind 2 4",       // the one beyond maxRiding, alone
		"127.0.0.3:9445 kind 2 7",       // the older agent's, alone
		"127.0.0.2:9445 kind 3 0 1 2 3", // maxRiding ride
		"127.0.0.3:9445 kind 1",         // the probe to the older agent carries none
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("sent:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if answered, rode := answers(m); answered != maxRiding+2 || rode != maxRiding {
		t.Errorf("answered %d, rode %d; want %d and %d", answered, rode, maxRiding+2, maxRiding)
	}
}
