package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// Two agents probe each other over loopback; ProbeStats reports the
// figures and a reset starts them again from zero. The probe ports here
// and in overlayprobe_test.go are 324xx: below the ephemeral range, which
// a socket bound to port 0 elsewhere could take first, and apart from
// package probe's 314xx, whose tests run at the same time.
func TestProbeStatsOverTwoAgents(t *testing.T) {
	ca := testConfig(t)
	ca.ProbeListen = "127.0.0.1:32471"
	ca.ProbePeers = "node-2=127.0.0.1:32472"
	ca.ProbeInterval = 2 * time.Millisecond
	ca.ProbeTimeout = 50 * time.Millisecond
	cb := testConfig(t)
	cb.NodeName = "node-2"
	cb.ProbeListen = "127.0.0.1:32472"
	a := startAgent(t, ca, newFake())
	startAgent(t, cb, newFake())

	ctx := context.Background()
	// Probes sent before node-2 listens are lost, truly: start counting
	// once it answers.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetPeers()) == 1 && r.GetPeers()[0].GetReceived() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-2 never answered: %v", r)
		}
	}
	time.Sleep(100 * time.Millisecond) // let probes in flight settle
	if _, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{Reset_: true}); err != nil {
		t.Fatal(err)
	}
	var resp *agentv1.ProbeStatsResponse
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if resp, err = a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); err != nil {
			t.Fatal(err)
		}
		if len(resp.GetPeers()) == 1 && resp.GetPeers()[0].GetReceived() >= 50 {
			break
		}
	}
	p := resp.GetPeers()
	if resp.GetNode() != "node-1" || resp.GetIntervalMicros() != 2000 || len(p) != 1 || p[0].GetPeer() != "node-2" ||
		p[0].GetReceived() < 50 || p[0].GetLost() != 0 || p[0].GetSent() != p[0].GetReceived() {
		t.Fatalf("probe stats: %v", resp)
	}
	if _, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{Reset_: true}); err != nil {
		t.Fatal(err)
	}
	after, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetPeers()[0].GetSent() >= p[0].GetSent() {
		t.Fatalf("reset did not restart the counters: before %v after %v", p[0], after.GetPeers()[0])
	}
	// Info brings the same figures when asked (the coordinator's verify
	// reads a node back and its mesh in one call), and resets nothing.
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{ProbeStats: true})
	if err != nil {
		t.Fatal(err)
	}
	ip := info.GetProbeStats().GetPeers()
	if len(ip) != 1 || ip[0].GetPeer() != "node-2" || ip[0].GetSent() < after.GetPeers()[0].GetSent() ||
		info.GetProbeStats().GetIntervalMicros() != 2000 || info.GetProbeStats().GetNode() != "node-1" {
		t.Fatalf("Info's probe figures: %v (ProbeStats just before: %v)", info.GetProbeStats(), after)
	}
	if again, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); again.GetPeers()[0].GetSent() < ip[0].GetSent() {
		t.Fatalf("Info reset the counters: %v after %v", again.GetPeers()[0], ip[0])
	}
	if plain, _ := a.client.Info(ctx, &agentv1.InfoRequest{}); plain.GetProbeStats() != nil {
		t.Fatalf("Info not asked for probe figures brought them: %v", plain.GetProbeStats())
	}
	if code, body := a.get(t, "/metrics"); code != 200 || !strings.Contains(body, `cutover_agent_probe_sent_total{peer="node-2"}`) {
		t.Fatalf("/metrics lacks the probe counters: %d", code)
	}
	// A Prepare asked to (the coordinator's first) zeroes the counters
	// once prepared and says so; one not asked leaves them.
	time.Sleep(50 * time.Millisecond)
	before, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
	pr, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889, ResetProbeStats: true})
	if err != nil || !pr.GetProbeStatsReset() || pr.GetStatus().GetPhase() != agentv1.Phase_PHASE_PREPARED {
		t.Fatalf("Prepare with reset_probe_stats: %v, %v", pr, err)
	}
	zeroed, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
	if zeroed.GetPeers()[0].GetSent() >= before.GetPeers()[0].GetSent() {
		t.Fatalf("Prepare's reset did not restart the counters: before %v after %v", before.GetPeers()[0], zeroed.GetPeers()[0])
	}
	// The counters grow again first (a loaded CI machine took more than
	// 50 ms to count one probe), so that a reset would show as a drop.
	grown := zeroed
	for deadline := time.Now().Add(5 * time.Second); grown.GetPeers()[0].GetSent() < zeroed.GetPeers()[0].GetSent()+3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the counters did not grow again within 5 s of the reset: %v", grown.GetPeers()[0])
		}
		grown, _ = a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
	}
	replay, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	if err != nil || replay.GetProbeStatsReset() {
		t.Fatalf("Prepare without reset_probe_stats: %v, %v", replay, err)
	}
	if kept, _ := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{}); kept.GetPeers()[0].GetSent() < grown.GetPeers()[0].GetSent() {
		t.Fatalf("a Prepare not asked to reset the counters did: %v after %v", kept.GetPeers()[0], grown.GetPeers()[0])
	}
}

func TestProbeFlagsValidated(t *testing.T) {
	for _, tc := range []struct{ listen, peers, want string }{
		{"198.19.1.1", "", "--probe-listen"},
		{"198.19.1.1:9445", "n2", "--probe-peers"},
		{"198.19.1.1:9445", "n2=198.19.2.1", "--probe-peers"},
	} {
		cfg := testConfig(t)
		cfg.ProbeListen, cfg.ProbePeers = tc.listen, tc.peers
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("listen %q peers %q: %v, want an error naming %s", tc.listen, tc.peers, err, tc.want)
		}
	}
	cfg := testConfig(t)
	cfg.ProbeListen, cfg.ProbeInterval = "198.19.1.1:9445", time.Microsecond
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--probe-interval") {
		t.Errorf("1µs interval: %v", err)
	}
}

// A port changed behind the agent's back shows in cutover_agent_current_port
// without any RPC: the port-drift alert depends on it.
func TestCurrentPortMetricFollowsTheDataplane(t *testing.T) {
	cfg := testConfig(t)
	cfg.PortRefresh = 100 * time.Millisecond
	a := startAgent(t, cfg, newFake())
	want := func(port string) {
		t.Helper()
		var body string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, body = a.get(t, "/metrics"); strings.Contains(body, "\ncutover_agent_current_port "+port+"\n") {
				return
			}
		}
		t.Fatalf("cutover_agent_current_port never became %s", port)
	}
	want("4789")
	a.fake.SetPort(4999)
	want("4999")
}
