package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/pkg/ifaddr"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

func pfx(s string) ifaddr.Addr { return ifaddr.Addr{Prefix: netip.MustParsePrefix(s)} }

// Where the probe mesh runs, per backend and flags, or why it does not.
func TestOverlayAddressRules(t *testing.T) {
	node := ifaddr.Fake{
		"tun0":         {pfx("198.19.1.1/24")},
		"flannel.1":    {pfx("198.19.2.0/32")},
		"vxlan.calico": {ifaddr.Addr{Prefix: netip.MustParsePrefix("198.19.3.9/24"), Secondary: true}, pfx("169.254.1.1/16"), pfx("198.19.3.1/32")},
		"empty0":       nil,
		"linklocal0":   {pfx("169.254.7.7/16")},
	}
	ovs := Default()
	kernel := Default()
	kernel.Backend = BackendKernelVXLAN
	calico := kernel
	calico.KernelDevice = "vxlan.calico"
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	for _, tc := range []struct {
		name     string
		cfg      Config
		want     string
		whyParts []string
	}{
		{"ovs: tun0", ovs, "198.19.1.1:9445", nil},
		{"kernel-vxlan: the VXLAN device (flannel)", kernel, "198.19.2.0:9445", nil},
		{"kernel-vxlan: calico, the primary global address", calico, "198.19.3.1:9445", nil},
		{"--probe-interface", with(ovs, func(c *Config) { c.ProbeInterface = "flannel.1" }), "198.19.2.0:9445", nil},
		{"--probe-port", with(ovs, func(c *Config) { c.ProbePort = 7000 }), "198.19.1.1:7000", nil},
		{"--probe-address wins over the interface", with(ovs, func(c *Config) { c.ProbeAddress = "198.19.9.9"; c.ProbeInterface = "nope0" }), "198.19.9.9:9445", nil},
		{"--probe-listen wins over all", with(ovs, func(c *Config) { c.ProbeListen = "198.19.8.8:1234"; c.ProbePort = 7000 }), "198.19.8.8:1234", nil},
		{"no such interface", with(ovs, func(c *Config) { c.ProbeInterface = "nope0" }), "", []string{"nope0 does not exist", "--probe-address"}},
		{"no IPv4", with(ovs, func(c *Config) { c.ProbeInterface = "empty0" }), "", []string{"empty0 has no usable IPv4"}},
		{"link-local only", with(ovs, func(c *Config) { c.ProbeInterface = "linklocal0" }), "", []string{"linklocal0 has no usable IPv4"}},
	} {
		got, why := overlayAddress(tc.cfg, node)
		if tc.want != "" {
			if got.String() != tc.want || why != "" {
				t.Errorf("%s: %v %q, want %s", tc.name, got, why, tc.want)
			}
			continue
		}
		if got.IsValid() {
			t.Errorf("%s: %v, want no address", tc.name, got)
		}
		for _, p := range tc.whyParts {
			if !strings.Contains(why, p) {
				t.Errorf("%s: reason %q does not say %q", tc.name, why, p)
			}
		}
	}
}

func TestProbeFlagsDefaultsAndConflicts(t *testing.T) {
	d := Default()
	if !d.Probe || d.ProbePort != 9445 || d.ProbeInterface != "" {
		t.Fatalf("defaults: probe %v port %d interface %q; want on, 9445, per backend", d.Probe, d.ProbePort, d.ProbeInterface)
	}
	if err := testConfig(t).Validate(); err != nil {
		t.Fatalf("default probe flags refused: %v", err)
	}
	for _, tc := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.ProbePort = 0 }, "--probe-port"},
		{func(c *Config) { c.ProbePort = 70000 }, "--probe-port"},
		{func(c *Config) { c.ProbeAddress = "tun0" }, "--probe-address"},
		{func(c *Config) { c.ProbeAddress = "0.0.0.0" }, "--probe-address"},
		{func(c *Config) { c.ProbeAddress = "198.19.1.1"; c.ProbeListen = "198.19.1.1:9445" }, "--probe-address"},
		{func(c *Config) { c.ProbeInterface = "a/b" }, "--probe-interface"},
		{func(c *Config) { c.Probe = false; c.ProbeListen = "198.19.1.1:9445" }, "--probe=false"},
		{func(c *Config) { c.Probe = false; c.ProbePeers = "n2=198.19.2.1:9445" }, "--probe-peers"},
		{func(c *Config) { c.ProbePeers = "n2=198.19.2.1:9445,n3=198.19.2.1:9445" }, "--probe-peers"},
	} {
		cfg := testConfig(t)
		tc.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", cfg, err, tc.want)
		}
	}
	// Static peers without --probe-listen: the address is found at run time.
	cfg := testConfig(t)
	cfg.ProbePeers = "n2=198.19.2.1:9445"
	if err := cfg.Validate(); err != nil {
		t.Errorf("static peers with a discovered address: %v", err)
	}
}

func waitInfo(t *testing.T, a *testAgent, ok func(*agentv1.InfoResponse) bool) *agentv1.InfoResponse {
	t.Helper()
	var r *agentv1.InfoResponse
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if r, err = a.client.Info(context.Background(), &agentv1.InfoRequest{}); err != nil {
			t.Fatal(err)
		}
		if ok(r) {
			return r
		}
	}
	t.Fatalf("Info never as wanted: %v", r)
	return nil
}

// Two agents find their overlay address on their tun0 (loopback here),
// report it in Info; Prepare with peers makes node-1 probe exactly those,
// replacing its --probe-peers, and probing goes on through commit and
// rollback. A node without an overlay address is still ready and says why
// probing is off.
func TestPrepareHandsProbePeers(t *testing.T) {
	ctx := context.Background()
	tun0 := ifaddr.Fake{"tun0": {pfx("127.0.0.1/8")}}
	ca := testConfig(t)
	ca.ProbePort = 32481
	ca.ProbeInterval = 2 * time.Millisecond
	ca.ProbeTimeout = 50 * time.Millisecond
	ca.ProbePeers = "static=127.0.0.1:32489" // nobody there: replaced by Prepare
	cb := testConfig(t)
	cb.NodeName = "node-2"
	cb.ProbePort = 32482
	a := startAgent(t, ca, newFake(), WithInterfaceAddrs(tun0))
	b := startAgent(t, cb, newFake(), WithInterfaceAddrs(tun0))

	ia := waitInfo(t, a, func(r *agentv1.InfoResponse) bool { return r.GetProbeAddress() != "" })
	ib := waitInfo(t, b, func(r *agentv1.InfoResponse) bool { return r.GetProbeAddress() != "" })
	if ia.GetProbeAddress() != "127.0.0.1:32481" || ib.GetProbeAddress() != "127.0.0.1:32482" || ia.GetProbeOffReason() != "" {
		t.Fatalf("probe addresses %q (%q) and %q, want 127.0.0.1:32481 and :32482", ia.GetProbeAddress(), ia.GetProbeOffReason(), ib.GetProbeAddress())
	}

	// Bad peers fail the Prepare, naming the entry, and change nothing.
	for _, tc := range []struct {
		peers []*agentv1.ProbePeer
		want  string
	}{
		{[]*agentv1.ProbePeer{{Name: "node-2", Address: "127.0.0.1"}}, "probe_peers[0].address"},
		{[]*agentv1.ProbePeer{{Name: "node-1", Address: "127.0.0.1:1"}}, "this node itself"},
		{[]*agentv1.ProbePeer{{Name: "x", Address: "127.0.0.1:1"}, {Name: "x", Address: "127.0.0.1:2"}}, "listed twice"},
	} {
		_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: tc.peers})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("peers %v: %v, want INVALID_ARGUMENT naming %s", tc.peers, err, tc.want)
		}
	}
	if st, _ := a.client.Status(ctx, &agentv1.StatusRequest{}); st.GetPhase() != agentv1.Phase_PHASE_UNSPECIFIED && st.GetPhase() != agentv1.Phase_PHASE_IDLE {
		t.Fatalf("a refused Prepare changed the operation: %v", st)
	}
	if r, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); len(r.GetPeers()) != 1 || r.GetPeers()[0].GetPeer() != "static" {
		t.Fatalf("a refused Prepare changed the peers: %v", r)
	}

	before := time.Now().UnixNano()
	peers := []*agentv1.ProbePeer{{Name: "node-2", Address: ib.GetProbeAddress()}}
	if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: peers}); err != nil {
		t.Fatal(err)
	}
	answered := func(after int64) *agentv1.ProbeStatsResponse {
		t.Helper()
		var r *agentv1.ProbeStatsResponse
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			var err error
			if r, err = a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); err != nil {
				t.Fatal(err)
			}
			if p := r.GetPeers(); len(p) == 1 && p[0].GetLastAnsweredSentUnixNano() > after && p[0].GetReceived() > 0 {
				return r
			}
		}
		t.Fatalf("node-2 never answered a probe sent after %d: %v", after, r)
		return nil
	}
	r := answered(before)
	p := r.GetPeers()[0]
	if p.GetPeer() != "node-2" || p.GetAddress() != "127.0.0.1:32482" || p.GetProbingSinceUnixNano() < before ||
		p.GetLastAnswerUnixNano() < p.GetLastAnsweredSentUnixNano() || r.GetAddress() != "127.0.0.1:32481" ||
		r.GetNowUnixNano() < p.GetLastAnswerUnixNano() || r.GetTimeoutMicros() != 50_000 {
		t.Fatalf("after Prepare with peers: %v", r)
	}
	// A replayed Prepare keeps the counters.
	if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: peers}); err != nil {
		t.Fatal(err)
	}
	if r2, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); r2.GetPeers()[0].GetProbingSinceUnixNano() != p.GetProbingSinceUnixNano() || r2.GetPeers()[0].GetReceived() < p.GetReceived() {
		t.Fatalf("a replayed Prepare restarted the peer: %v then %v", p, r2.GetPeers()[0])
	}

	// Probing goes on through commit and rollback.
	cr, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", DeadmanMillis: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	answered(cr.GetAppliedUnixNano())
	rollbackAt := time.Now().UnixNano()
	if _, err := a.client.Rollback(ctx, &agentv1.RollbackRequest{OperationId: "op-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	answered(rollbackAt)

	// No overlay address: probing off, the agent ready all the same.
	cc := testConfig(t)
	cc.NodeName = "node-3"
	c := startAgent(t, cc, newFake(), WithInterfaceAddrs(ifaddr.Fake{}))
	ic := waitInfo(t, c, func(r *agentv1.InfoResponse) bool {
		return r.GetReady() && strings.Contains(r.GetProbeOffReason(), "tun0 does not exist")
	})
	if ic.GetProbeAddress() != "" {
		t.Fatalf("no overlay address, yet probe address %q", ic.GetProbeAddress())
	}
	// --probe=false says so.
	cd := testConfig(t)
	cd.NodeName = "node-4"
	cd.Probe = false
	d := startAgent(t, cd, newFake())
	if id := waitInfo(t, d, func(r *agentv1.InfoResponse) bool { return r.GetReady() }); !strings.Contains(id.GetProbeOffReason(), "--probe=false") {
		t.Fatalf("probing disabled, reason %q", id.GetProbeOffReason())
	}
	if _, err := d.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: peers}); err != nil {
		t.Fatalf("Prepare with peers on an agent with probing off: %v", err)
	}
}

// The peers a Prepare gave stay while the operation is in flight and for
// --probe-linger after it ended, then the mesh goes back to --probe-peers.
func TestProbePeersLingerOut(t *testing.T) {
	ctx := context.Background()
	ca := testConfig(t)
	ca.ProbePort = 32483
	ca.ProbeInterval = 2 * time.Millisecond
	ca.ProbeTimeout = 50 * time.Millisecond
	ca.ProbePeers = "static=127.0.0.1:32490"
	ca.ProbeLinger = 300 * time.Millisecond
	a, bAddr := probingPair(t, ca, 32484)
	peerNow := func() string {
		r, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
		if err != nil || len(r.GetPeers()) != 1 {
			t.Fatalf("probe stats: %v, %v", r, err)
		}
		return r.GetPeers()[0].GetPeer()
	}
	peers := []*agentv1.ProbePeer{{Name: "node-2", Address: bAddr}}
	if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: peers}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", DeadmanMillis: 30_000}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // two of the linger's checks, the operation in flight
	if p := peerNow(); p != "node-2" {
		t.Fatalf("in flight for longer than the linger, the mesh probes %q; want node-2 kept", p)
	}
	if _, err := a.client.Rollback(ctx, &agentv1.RollbackRequest{OperationId: "op-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); peerNow() != "static"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the operation ended the mesh still probes %q; want the --probe-peers back after the 300ms linger", peerNow())
		}
	}
}

// A held staged operation parks the mesh (ProbeStats park): the sample a
// Prepare gave is dropped at once, though the operation is in flight, and
// a replayed Prepare of the same operation gives it back.
func TestProbePeersPark(t *testing.T) {
	ctx := context.Background()
	ca := testConfig(t)
	ca.ProbePort = 32485
	ca.ProbePeers = "static=127.0.0.1:32491"
	a, bAddr := probingPair(t, ca, 32486)
	probing := func(req *agentv1.ProbeStatsRequest) string {
		t.Helper()
		r, err := a.client.ProbeStats(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range r.GetPeers() {
			names = append(names, p.GetPeer())
		}
		return strings.Join(names, ",")
	}
	peers := []*agentv1.ProbePeer{{Name: "node-2", Address: bAddr}}
	prepare := &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ProbePeers: peers, Strategy: "staged"}
	if _, err := a.client.Prepare(ctx, prepare); err != nil {
		t.Fatal(err)
	}
	if p := probing(&agentv1.ProbeStatsRequest{}); p != "node-2" {
		t.Fatalf("after Prepare the mesh probes %q, want node-2", p)
	}
	if p := probing(&agentv1.ProbeStatsRequest{Park: true}); p != "node-2" {
		t.Fatalf("the parking read reports %q, want node-2 (read, then parked)", p)
	}
	if p := probing(&agentv1.ProbeStatsRequest{}); p != "static" {
		t.Fatalf("parked, the mesh probes %q, want the --probe-peers (static)", p)
	}
	if _, err := a.client.Prepare(ctx, prepare); err != nil {
		t.Fatal(err)
	}
	if p := probing(&agentv1.ProbeStatsRequest{}); p != "node-2" {
		t.Fatalf("after the replayed Prepare the mesh probes %q, want node-2 back", p)
	}
}

// probingPair starts agent a (ca) and node-2 (probe port portB) probing on
// loopback, waits until both probe, and returns a and node-2's probe
// address.
func probingPair(t *testing.T, ca Config, portB int) (*testAgent, string) {
	t.Helper()
	tun0 := ifaddr.Fake{"tun0": {pfx("127.0.0.1/8")}}
	cb := testConfig(t)
	cb.NodeName = "node-2"
	cb.ProbePort = portB
	a := startAgent(t, ca, newFake(), WithInterfaceAddrs(tun0))
	b := startAgent(t, cb, newFake(), WithInterfaceAddrs(tun0))
	waitInfo(t, a, func(r *agentv1.InfoResponse) bool { return r.GetProbeAddress() != "" })
	ib := waitInfo(t, b, func(r *agentv1.InfoResponse) bool { return r.GetProbeAddress() != "" })
	return a, ib.GetProbeAddress()
}
