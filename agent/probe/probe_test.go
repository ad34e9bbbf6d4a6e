package probe

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The tests bind fixed loopback ports below the kernel's ephemeral range
// (32768-60999 by default), where a socket bound to port 0 elsewhere (the
// tests of other packages run at the same time) cannot take them first:
// 314xx here, 324xx in package agent.
func startMesh(t *testing.T, cfg Config) (*Mesh, context.CancelFunc, chan error) {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return m, cancel, done
}

func stop(t *testing.T, cancel context.CancelFunc, done chan error) {
	t.Helper()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// Two meshes on loopback probe each other; then B goes silent for a while and
// the figures must show exactly that outage: losses and a long gap.
func TestMeshCountsAnswersLossesAndGaps(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:31461")
	b := netip.MustParseAddrPort("127.0.0.1:31462")
	cfgA := Config{Listen: a, Peers: []Peer{{Name: "b", Addr: b}}, Interval: 2 * time.Millisecond, Timeout: 50 * time.Millisecond}
	cfgB := Config{Listen: b, Interval: 2 * time.Millisecond}
	ma, cancelA, doneA := startMesh(t, cfgA)
	defer stop(t, cancelA, doneA)
	_, cancelB, doneB := startMesh(t, cfgB)

	time.Sleep(300 * time.Millisecond)
	st := ma.Stats(true)
	if len(st) != 1 || st[0].Peer != "b" || st[0].Address != b.String() {
		t.Fatalf("stats = %+v", st)
	}
	if st[0].Sent < 50 || st[0].Received != st[0].Sent || st[0].Lost != 0 {
		t.Fatalf("healthy phase: sent=%d received=%d lost=%d; want >=50 sent, all answered", st[0].Sent, st[0].Received, st[0].Lost)
	}
	if st[0].LongestGap > 60*time.Millisecond {
		t.Errorf("healthy phase: longest gap %v at a 2ms interval", st[0].LongestGap)
	}

	// Outage: B stops answering for 200 ms. B answers until its socket
	// is closed, somewhere between outage and stopped.
	outage := time.Now()
	stop(t, cancelB, doneB)
	stopped := time.Now()
	time.Sleep(200 * time.Millisecond)
	_, cancelB, doneB = startMesh(t, cfgB)
	defer stop(t, cancelB, doneB)
	time.Sleep(200 * time.Millisecond)

	st = ma.Stats(false)
	if st[0].Lost < 40 {
		t.Errorf("outage: lost=%d, want about 100 (200ms at 2ms)", st[0].Lost)
	}
	if st[0].LongestGap < 150*time.Millisecond || st[0].LongestGap > 2*time.Second {
		t.Errorf("outage: longest gap %v, want about 200ms", st[0].LongestGap)
	}
	// The gap began with the last answer before the outage: within a few
	// intervals before B stopped, never after it. (A CI run had an answer
	// arrive 7 µs after outage was read, B not yet stopped.)
	if from := st[0].LongestGapFrom; from.After(stopped) || outage.Sub(from) > 50*time.Millisecond {
		t.Errorf("outage began %v, B stopped %v, longest gap from %v (%v before the outage began)", outage.Format(time.StampMicro), stopped.Format(time.StampMicro), from.Format(time.StampMicro), outage.Sub(from))
	}
	if st[0].Received == 0 {
		t.Error("no answers after B came back")
	}
	if st[0].Sent != st[0].Received+st[0].Lost {
		t.Errorf("sent %d != received %d + lost %d", st[0].Sent, st[0].Received, st[0].Lost)
	}
}

func TestCodecRejectsForeignPackets(t *testing.T) {
	var b [packetSize + maxRiding*answerSize]byte
	for _, p := range []packet{
		{kind: kindReq, seq: 7, ts: 42 | rides},
		{kind: kindResp, seq: 7, ts: 42},
		{kind: kindReqResp, seq: 7, ts: 42 | rides, nAns: 1, ans: [maxRiding]echo{{9, 41}}},
		{kind: kindReqResp, seq: 7, ts: 42 | rides, nAns: maxRiding, ans: [maxRiding]echo{{9, 41}, {10, 43}, {11, 45}, {12, 47 | rides}}},
	} {
		n := encode(b[:], p)
		if got, ok := decode(b[:n]); !ok || got != p {
			t.Fatalf("round trip of %+v (%d bytes): %+v %v", p, n, got, ok)
		}
	}
	// An agent before riding answers decoded exactly packetSize bytes of
	// kinds 1 and 2: a probe with an answer in it must not look like one.
	if n := encode(b[:], packet{kind: kindReqResp, nAns: 1}); n == packetSize || b[4] == kindReq || b[4] == kindResp {
		t.Fatalf("a riding answer is %d bytes of kind %d: an older agent would read it", n, b[4])
	}
	n := encode(b[:], packet{kind: kindReq, seq: 7, ts: 42})
	for name, p := range map[string][]byte{
		"short":        b[:10],
		"long":         append(b[:n:n], 0),
		"bad magic":    append([]byte{0, 0, 0, 0}, b[4:n]...),
		"bad kind":     append(append([]byte{}, b[:4]...), append([]byte{9}, b[5:n]...)...),
		"riding, none": append(append([]byte{}, b[:4]...), append([]byte{kindReqResp}, b[5:n]...)...),
		"riding, torn": append(append(append([]byte{}, b[:4]...), append([]byte{kindReqResp}, b[5:n]...)...), make([]byte, answerSize-1)...),
		"riding, many": append(append(append([]byte{}, b[:4]...), append([]byte{kindReqResp}, b[5:n]...)...), make([]byte, (maxRiding+1)*answerSize)...),
	} {
		if _, ok := decode(p); ok {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestParsePeersAndValidate(t *testing.T) {
	p, err := ParsePeers("n2=198.19.2.1:9445, n3=198.19.3.1:9445")
	if err != nil || len(p) != 2 || p[1].Name != "n3" || p[1].Addr.Port() != 9445 {
		t.Fatalf("ParsePeers = %+v, %v", p, err)
	}
	for _, bad := range []string{"n2", "=198.19.2.1:1", "n2=198.19.2.1", "n2=198.19.2.1:1,n2=198.19.2.2:1"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("ParsePeers(%q) accepted", bad)
		}
	}
	ok := Config{Listen: netip.MustParseAddrPort("127.0.0.1:1"), Interval: time.Millisecond, Timeout: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := ok
	bad.Interval = time.Microsecond
	if err := bad.Validate(); err == nil {
		t.Error("1µs interval accepted")
	}
	// No listen address yet is fine for New (the agent finds it later);
	// running without one is not.
	bad = ok
	bad.Listen = netip.AddrPort{}
	m, err := New(bad)
	if err != nil {
		t.Fatalf("New without a listen address: %v", err)
	}
	if err := m.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "no listen address") {
		t.Errorf("Run without a listen address: %v", err)
	}
	for _, peers := range [][]Peer{
		{{Name: "", Addr: netip.MustParseAddrPort("198.19.2.1:9445")}},
		{{Name: "a", Addr: netip.MustParseAddrPort("198.19.2.1:9445")}, {Name: "b", Addr: netip.MustParseAddrPort("198.19.2.1:9445")}},
		{{Name: "a", Addr: netip.MustParseAddrPort("198.19.2.1:0")}},
		{{Name: "a", Addr: netip.MustParseAddrPort("0.0.0.0:9445")}},
	} {
		bad = ok
		bad.Peers = peers
		if err := bad.Validate(); err == nil {
			t.Errorf("peers %v accepted", peers)
		}
	}
	if _, err := ParsePeers("a=198.19.2.1:9445,b=198.19.2.1:9445"); err == nil || !strings.Contains(err.Error(), `also peer "a"'s`) {
		t.Errorf("two peers on one address: %v", err)
	}
}

// fakeSend sends one probe to peer at the fake clock's now, as round
// does, and returns its sequence number and send time.
func fakeSend(m *Mesh, peer netip.AddrPort, now time.Time) (uint64, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.peers[peer]
	seq := ps.nextSeq
	ps.nextSeq++
	ps.sentAt[seq%window] = now.UnixNano()
	ps.answered[seq%window] = false
	return seq, now.UnixNano()
}

// A new peer set replaces the old: peers kept under the same name and
// address keep their counters (a replayed Prepare changes nothing), new
// ones start from zero with their own start time, dropped ones are gone.
func TestSetPeersReplacesTheSet(t *testing.T) {
	now := time.Unix(1000, 0)
	p1, p2, p3 := netip.MustParseAddrPort("198.19.1.1:9445"), netip.MustParseAddrPort("198.19.2.1:9445"), netip.MustParseAddrPort("198.19.3.1:9445")
	m, err := New(Config{Peers: []Peer{{Name: "n1", Addr: p1}, {Name: "n2", Addr: p2}},
		Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	start := now
	for _, p := range []netip.AddrPort{p1, p2} {
		seq, at := fakeSend(m, p, now)
		m.onReply(p, seq, at, time.Time{})
	}
	now = now.Add(time.Second)
	set := []Peer{{Name: "n2", Addr: p2}, {Name: "n3", Addr: p3}}
	if err := m.SetPeers(set); err != nil {
		t.Fatal(err)
	}
	text := func() string {
		var b strings.Builder
		for _, st := range m.Stats(false) {
			fmt.Fprintf(&b, "%s %s sent=%d received=%d lost=%d since=%d\n", st.Peer, st.Address, st.Sent, st.Received, st.Lost, st.Since.Sub(start).Milliseconds())
		}
		return b.String()
	}
	want := "n2 198.19.2.1:9445 sent=1 received=1 lost=0 since=0\n" +
		"n3 198.19.3.1:9445 sent=0 received=0 lost=0 since=1000\n"
	if got := text(); got != want {
		t.Fatalf("after SetPeers:\n%s\nwant:\n%s", got, want)
	}
	now = now.Add(time.Second)
	if err := m.SetPeers(set); err != nil { // replay
		t.Fatal(err)
	}
	if got := text(); got != want {
		t.Fatalf("a replayed SetPeers changed the figures:\n%s\nwant:\n%s", got, want)
	}
	// A renamed peer on the same address is another peer: from zero.
	if err := m.SetPeers([]Peer{{Name: "n2-new", Addr: p2}}); err != nil {
		t.Fatal(err)
	}
	if got := text(); got != "n2-new 198.19.2.1:9445 sent=0 received=0 lost=0 since=2000\n" {
		t.Fatalf("renamed peer: %s", got)
	}
	// A refused set changes nothing.
	if err := m.SetPeers([]Peer{{Name: "a", Addr: p1}, {Name: "a", Addr: p3}}); err == nil {
		t.Fatal("duplicate names accepted")
	}
	if got := m.Peers(); len(got) != 1 || got[0].Name != "n2-new" {
		t.Fatalf("a refused set changed the peers: %v", got)
	}
}

// The answer times: LastAnswer is when the latest answer came,
// LastAnsweredSent when the latest answered probe left; an old probe
// answered late does not move LastAnsweredSent back; a reset keeps both.
func TestStatsAnswerTimes(t *testing.T) {
	now := time.Unix(1000, 0)
	peer := netip.MustParseAddrPort("198.19.2.1:9445")
	m, err := New(Config{Peers: []Peer{{Name: "n2", Addr: peer}},
		Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(false)[0]; !st.LastAnswer.IsZero() || !st.LastAnsweredSent.IsZero() || !st.Since.Equal(now) {
		t.Fatalf("fresh peer: %+v", st)
	}
	s0, t0 := fakeSend(m, peer, now)
	now = now.Add(10 * time.Millisecond)
	s1, t1 := fakeSend(m, peer, now)
	now = now.Add(5 * time.Millisecond)
	m.onReply(peer, s1, t1, time.Time{})
	now = now.Add(5 * time.Millisecond)
	m.onReply(peer, s0, t0, time.Time{}) // older probe, answered later
	st := m.Stats(true)[0]
	if !st.LastAnswer.Equal(now) || st.LastAnsweredSent.UnixNano() != t1 {
		t.Fatalf("last answer %v (want %v), last answered sent %d (want %d)", st.LastAnswer, now, st.LastAnsweredSent.UnixNano(), t1)
	}
	if after := m.Stats(false)[0]; !after.LastAnswer.Equal(st.LastAnswer) || !after.LastAnsweredSent.Equal(st.LastAnsweredSent) || after.Sent != 0 {
		t.Fatalf("reset: %+v; want zero counters and the same times", after)
	}
}

// The peer set changes under a running mesh while stats and metrics are
// read (run with -race): probing follows the newest set.
func TestSetPeersWhileRunning(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:31463")
	b := netip.MustParseAddrPort("127.0.0.1:31464")
	c := netip.MustParseAddrPort("127.0.0.1:31465") // nobody answers
	ma, cancelA, doneA := startMesh(t, Config{Listen: a, Interval: time.Millisecond, Timeout: 50 * time.Millisecond})
	defer stop(t, cancelA, doneA)
	_, cancelB, doneB := startMesh(t, Config{Listen: b, Interval: time.Millisecond})
	defer stop(t, cancelB, doneB)
	reg := prometheus.NewRegistry()
	reg.MustRegister(ma.Collector())
	var wg sync.WaitGroup
	stopReads := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopReads:
				return
			default:
				ma.Stats(false)
				_, _ = reg.Gather()
			}
		}
	}()
	sets := [][]Peer{{{Name: "b", Addr: b}}, {{Name: "c", Addr: c}}, {{Name: "b", Addr: b}, {Name: "c", Addr: c}}, nil}
	for i := 0; i < 200; i++ {
		if err := ma.SetPeers(sets[i%len(sets)]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(stopReads)
	wg.Wait()
	if err := ma.SetPeers([]Peer{{Name: "b", Addr: b}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := ma.Stats(false)
		if len(st) == 1 && st[0].Peer == "b" && st[0].Received >= 20 && !st[0].LastAnsweredSent.Before(st[0].Since) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never answered after the last SetPeers: %+v", st)
		}
	}
}

// fakeClockMesh is a mesh (not running) probing one peer, "p" at
// 127.0.0.1:9, every interval with a 100 ms timeout, on a fake clock that
// starts at Unix 1000 and moves when the test moves *now.
func fakeClockMesh(t *testing.T, interval time.Duration) (*Mesh, *time.Time, netip.AddrPort) {
	t.Helper()
	now := new(time.Time)
	*now = time.Unix(1000, 0)
	peer := netip.MustParseAddrPort("127.0.0.1:9")
	m, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:8"), Peers: []Peer{{Name: "p", Addr: peer}},
		Interval: interval, Timeout: 100 * time.Millisecond, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	return m, now, peer
}

// Settling is exact with a fake clock: a probe counts as lost only once its
// timeout has passed, and answers to settled probes are ignored.
func TestSettleWithFakeClock(t *testing.T) {
	m, now, peer := fakeClockMesh(t, 10*time.Millisecond)
	ps := m.peers[peer]
	send := func() (uint64, int64) {
		m.mu.Lock()
		defer m.mu.Unlock()
		seq := ps.nextSeq
		ps.nextSeq++
		ps.sentAt[seq%window] = now.UnixNano()
		ps.answered[seq%window] = false
		return seq, now.UnixNano()
	}
	s0, t0 := send()
	*now = now.Add(10 * time.Millisecond)
	send() // never answered
	*now = now.Add(5 * time.Millisecond)
	m.onReply(peer, s0, t0, time.Time{})
	if st := m.Stats(false)[0]; st.Sent != 0 {
		t.Fatalf("before the timeout nothing is settled: %+v", st)
	}
	*now = now.Add(200 * time.Millisecond)
	st := m.Stats(false)[0]
	if st.Sent != 2 || st.Received != 1 || st.Lost != 1 {
		t.Fatalf("after the timeout: %+v, want sent 2 received 1 lost 1", st)
	}
	m.onReply(peer, 1, 0, time.Time{}) // late answer to a settled probe
	if st2 := m.Stats(false)[0]; st2.Received != 1 {
		t.Fatalf("late answer counted: %+v", st2)
	}
}

func TestCollectorIsLintCleanAndCounts(t *testing.T) {
	now := time.Unix(1000, 0)
	peer := netip.MustParseAddrPort("127.0.0.1:9")
	m, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:8"), Peers: []Peer{{Name: "n2", Addr: peer}},
		Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ps := m.peers[peer]
	ps.sentAt[0] = now.UnixNano()
	ps.nextSeq = 1
	now = now.Add(time.Second)
	m.Stats(true) // a reset must not lower the Prometheus counters
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collector())
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	want := `# HELP cutover_agent_probe_lost_total Overlay probes to a peer that were not answered within the timeout.
# TYPE cutover_agent_probe_lost_total counter
cutover_agent_probe_lost_total{peer="n2"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cutover_agent_probe_lost_total"); err != nil {
		t.Fatal(err)
	}
}

// The shipped (untagged) build cannot drop answers on purpose.
func TestFaultInjectionOffByDefault(t *testing.T) {
	if FaultInjectBuilt {
		t.Skip("built with cutover_faultinject")
	}
	for seq := range uint64(100) {
		if dropAnswer(seq) {
			t.Fatalf("dropAnswer(%d) in the default build", seq)
		}
	}
	if hiddenLoss() {
		t.Fatal("hiddenLoss in the default build")
	}
	if rideToAll() {
		t.Fatal("rideToAll in the default build")
	}
}

// An agent busy elsewhere reads answers late. What counts is when they
// arrived (the kernel's stamp): an answer that arrived in time but was
// read after its probe was settled as lost is received, and a burst of
// answers read late is no gap. One that arrived after the timeout stays
// lost; one from before a reset counts nowhere.
func TestAnswersCountWhenTheyArrived(t *testing.T) {
	m, now, peer := fakeClockMesh(t, time.Millisecond)
	ps := m.peers[peer]
	var sent []time.Time
	send := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		seq := ps.nextSeq
		ps.nextSeq++
		ps.sentAt[seq%window] = now.UnixNano()
		ps.answered[seq%window] = false
		m.settleLocked(ps, *now)
		sent = append(sent, *now)
	}
	for range 10 { // probes 0-9, one per ms
		send()
		*now = now.Add(time.Millisecond)
	}
	// The agent stalls 300 ms; the answers to 0-8 arrived 0.5 ms after
	// each probe, 9's arrived 150 ms late. Its sender runs first and
	// settles all ten as lost.
	*now = now.Add(300 * time.Millisecond)
	send() // probe 10
	if st := m.Stats(false)[0]; st.Lost != 10 || st.Received != 0 {
		t.Fatalf("before the late read: %+v, want 10 lost", st)
	}
	for seq := range uint64(9) {
		m.onReply(peer, seq, sent[seq].UnixNano(), sent[seq].Add(500*time.Microsecond))
	}
	m.onReply(peer, 9, sent[9].UnixNano(), sent[9].Add(150*time.Millisecond))
	st := m.Stats(false)[0]
	if st.Received != 9 || st.Lost != 1 || st.Sent != 10 {
		t.Fatalf("after the late read: %+v, want received 9 lost 1 (the answer that arrived after the timeout)", st)
	}
	// Between answers (Stats adds the ongoing silence since answer 8,
	// which is real: probe 9 was lost and the sender was stalled).
	m.mu.Lock()
	between := ps.longest
	m.mu.Unlock()
	if between > 2*time.Millisecond {
		t.Errorf("longest gap between answers %s: answers that arrived every 1 ms, read late, are no gap", between)
	}
	// Probe 10's answer arrives after a reset: the reset forgot it.
	m.Stats(true)
	m.onReply(peer, 10, sent[10].UnixNano(), *now)
	*now = now.Add(time.Second)
	if st := m.Stats(false)[0]; st.Received != 0 || st.Lost != 0 {
		t.Fatalf("an answer from before the reset counted: %+v", st)
	}
}

// On Linux the kernel stamps answers: a real pair of meshes on loopback
// reports the stamp, not the read time, as the last answer.
func TestRxStampOnLoopback(t *testing.T) {
	if !rxStampsSupported {
		t.Skip("no SO_TIMESTAMPNS here")
	}
	a := netip.MustParseAddrPort("127.0.0.1:31471")
	b := netip.MustParseAddrPort("127.0.0.1:31472")
	ma, cancelA, doneA := startMesh(t, Config{Listen: a, Peers: []Peer{{Name: "b", Addr: b}}, Interval: 5 * time.Millisecond, Timeout: 100 * time.Millisecond})
	_, cancelB, doneB := startMesh(t, Config{Listen: b, Interval: 5 * time.Millisecond, Timeout: 100 * time.Millisecond})
	time.Sleep(200 * time.Millisecond)
	stamped := ma.rxStamped.Load()
	stop(t, cancelA, doneA)
	stop(t, cancelB, doneB)
	if stamped == 0 {
		t.Fatal("no answer carried a kernel receive stamp")
	}
}

// A mesh started without peers (an agent between operations) idles without
// a ticker; SetPeers must wake it and probing must start at once.
func TestIdleMeshWakesOnSetPeers(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:31466")
	b := netip.MustParseAddrPort("127.0.0.1:31467")
	ma, cancelA, doneA := startMesh(t, Config{Listen: a, Interval: time.Millisecond, Timeout: 50 * time.Millisecond})
	defer stop(t, cancelA, doneA)
	_, cancelB, doneB := startMesh(t, Config{Listen: b, Interval: time.Millisecond})
	defer stop(t, cancelB, doneB)
	time.Sleep(30 * time.Millisecond) // both loops reach their idle wait
	if err := ma.SetPeers([]Peer{{Name: "b", Addr: b}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := ma.Stats(false); len(st) == 1 && st[0].Received >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle mesh given a peer never probed it: %+v", ma.Stats(false))
		}
	}
	// And back to idle, then peers again.
	if err := ma.SetPeers(nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := ma.SetPeers([]Peer{{Name: "b", Addr: b}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := ma.Stats(false); len(st) == 1 && st[0].Received >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mesh did not resume after going idle: %+v", ma.Stats(false))
		}
	}
}

// Stall is how far the agent fell behind its own mesh: a round sent after
// it was due, an answer read after it arrived; a reset clears it, and a
// stamp of another clock is no measurement.
func TestStallMeasuresTheAgentFallingBehind(t *testing.T) {
	m, now, peer := fakeClockMesh(t, 10*time.Millisecond)
	b := newBuffers()
	sendRound := func() {
		m.round(b)
		b.tx = b.tx[:0] // queued, not sent: the stall is the round's lateness
	}
	stall := func(reset bool) time.Duration {
		_, d := m.Snapshot(reset)
		return d
	}
	sendRound()
	*now = now.Add(10 * time.Millisecond)
	sendRound()
	if d := stall(false); d != 0 {
		t.Fatalf("rounds on time: stall %s, want 0", d)
	}
	*now = now.Add(40 * time.Millisecond) // due after 10 ms: 30 ms late
	sendRound()
	if d := stall(false); d != 30*time.Millisecond {
		t.Fatalf("a round 30 ms late: stall %s", d)
	}
	// The answer to the last round arrived 2 ms after it left and was
	// read 45 ms later.
	sent := *now
	*now = now.Add(47 * time.Millisecond)
	m.onReply(peer, 2, sent.UnixNano(), sent.Add(2*time.Millisecond))
	if d := stall(true); d != 45*time.Millisecond {
		t.Fatalf("an answer read 45 ms after it arrived: stall %s", d)
	}
	if d := stall(false); d != 0 {
		t.Fatalf("after the reset: stall %s, want 0", d)
	}
	m.onReply(peer, 1, 0, now.Add(-time.Hour)) // another clock's stamp
	if d := stall(false); d != 0 {
		t.Fatalf("a stamp an hour off counted as a stall of %s", d)
	}
}

// A mesh whose reader is blocked in a read (no peers of its own: nothing
// ticks) stops when its context ends, without waiting out the read's
// timeout, and its port is free again at once: a restarted agent (or a
// mesh moved to a new overlay address and back) binds it.
func TestStopWakesTheBlockedReader(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:31481")
	_, cancel, done := startMesh(t, Config{Listen: a, Interval: 10 * time.Millisecond})
	time.Sleep(50 * time.Millisecond) // the reader blocks in its read
	begin := time.Now()
	stop(t, cancel, done)
	if took := time.Since(begin); took >= readTimeout/2 {
		t.Errorf("Run returned %s after its context ended: it waited out the reader's %s timeout instead of waking it", took, readTimeout)
	}
	_, cancel, done = startMesh(t, Config{Listen: a, Interval: 10 * time.Millisecond})
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a mesh on the stopped mesh's port: %v", err)
	default:
	}
	stop(t, cancel, done)
}

// The lost probes come back as runs of consecutive sends with their send
// times, adding up to Lost: an answer taken back shrinks its run, a reset
// forgets them, and past maxLossRuns the last run takes the rest.
func TestLossRuns(t *testing.T) {
	m, now, peer := fakeClockMesh(t, time.Millisecond)
	ps := m.peers[peer]
	var sent []time.Time
	// send sends one probe a millisecond; answer says whether its answer
	// arrives 0.5 ms later.
	send := func(answer bool) {
		m.mu.Lock()
		seq := ps.nextSeq
		ps.nextSeq++
		ps.sentAt[seq%window] = now.UnixNano()
		ps.answered[seq%window] = false
		m.settleLocked(ps, *now)
		m.mu.Unlock()
		sent = append(sent, *now)
		if answer {
			m.onReply(peer, seq, now.UnixNano(), now.Add(500*time.Microsecond))
		}
		*now = now.Add(time.Millisecond)
	}
	pattern := "aallllaaalaaallaa" // probes 2-5, 9 and 13-14 lost
	for _, c := range pattern {
		send(c == 'a')
	}
	// Settle them all (the timeout is 100 ms), within a second of the
	// sends: a stamp further off than that is not the mesh's clock.
	*now = now.Add(200 * time.Millisecond)
	st := m.Stats(false)[0]
	want := []LossRun{{sent[2], sent[5], 4}, {sent[9], sent[9], 1}, {sent[13], sent[14], 2}}
	if st.Lost != 7 || !slices.Equal(st.Losses, want) {
		t.Fatalf("lost %d, runs %v; want 7 in %v", st.Lost, st.Losses, want)
	}
	// Probe 3's answer was read late but had arrived in time: taken back.
	m.onReply(peer, 3, sent[3].UnixNano(), sent[3].Add(time.Millisecond))
	st = m.Stats(true)[0]
	if want[0].Count = 3; st.Lost != 6 || !slices.Equal(st.Losses, want) {
		t.Fatalf("after the taken-back answer: lost %d, runs %v; want 6 in %v", st.Lost, st.Losses, want)
	}
	if st = m.Stats(false)[0]; st.Lost != 0 || len(st.Losses) != 0 {
		t.Fatalf("after a reset: %+v, want no losses", st)
	}
	// More separate losses than maxLossRuns: the count stays exact.
	sent = sent[:0]
	for range maxLossRuns + 10 {
		send(false)
		send(true)
	}
	*now = now.Add(time.Second)
	st = m.Stats(false)[0]
	var sum uint64
	for _, r := range st.Losses {
		sum += r.Count
	}
	last := st.Losses[len(st.Losses)-1]
	if len(st.Losses) != maxLossRuns || sum != st.Lost || st.Lost != maxLossRuns+10 || last.Count != 11 || !last.Last.Equal(sent[len(sent)-2]) {
		t.Fatalf("%d runs adding up to %d of %d lost, last %+v; want %d runs, the last of 11 ending at the last lost send", len(st.Losses), sum, st.Lost, last, maxLossRuns)
	}
}
