package probe

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
	a := netip.MustParseAddrPort("127.0.0.1:39461")
	b := netip.MustParseAddrPort("127.0.0.1:39462")
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

	// Outage: B stops answering for 200 ms.
	stop(t, cancelB, doneB)
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
	if st[0].Received == 0 {
		t.Error("no answers after B came back")
	}
	if st[0].Sent != st[0].Received+st[0].Lost {
		t.Errorf("sent %d != received %d + lost %d", st[0].Sent, st[0].Received, st[0].Lost)
	}
}

func TestCodecRejectsForeignPackets(t *testing.T) {
	var b [packetSize]byte
	encode(b[:], kindReq, 7, 42)
	if k, s, ts, ok := decode(b[:]); !ok || k != kindReq || s != 7 || ts != 42 {
		t.Fatalf("round trip: %v %v %v %v", k, s, ts, ok)
	}
	for name, p := range map[string][]byte{
		"short":     b[:10],
		"long":      append(b[:], 0),
		"bad magic": append([]byte{0, 0, 0, 0}, b[4:]...),
		"bad kind":  append(append([]byte{}, b[:4]...), append([]byte{9}, b[5:]...)...),
	} {
		if _, _, _, ok := decode(p); ok {
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
	bad = ok
	bad.Listen = netip.AddrPort{}
	if err := bad.Validate(); err == nil {
		t.Error("empty listen accepted")
	}
}

// Settling is exact with a fake clock: a probe counts as lost only once its
// timeout has passed, and answers to settled probes are ignored.
func TestSettleWithFakeClock(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	peer := netip.MustParseAddrPort("127.0.0.1:9")
	m, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:8"), Peers: []Peer{{Name: "p", Addr: peer}},
		Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
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
	now = now.Add(10 * time.Millisecond)
	send() // never answered
	now = now.Add(5 * time.Millisecond)
	m.onReply(peer, s0, t0)
	if st := m.Stats(false)[0]; st.Sent != 0 {
		t.Fatalf("before the timeout nothing is settled: %+v", st)
	}
	now = now.Add(200 * time.Millisecond)
	st := m.Stats(false)[0]
	if st.Sent != 2 || st.Received != 1 || st.Lost != 1 {
		t.Fatalf("after the timeout: %+v, want sent 2 received 1 lost 1", st)
	}
	m.onReply(peer, 1, 0) // late answer to a settled probe
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
