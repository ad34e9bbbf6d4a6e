package agent

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/version"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	s, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseSend()
	if err := s.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, svc := range r.GetListServicesResponse().GetService() {
		out = append(out, svc.GetName())
	}
	return out
}

func TestHealthzReadyz(t *testing.T) {
	f := newFake()
	a := startAgent(t, testConfig(t), f)
	if code, body := a.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, body := a.get(t, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	f.SetNotReady("ovsdb unix:/run/openvswitch/db.sock: connection refused")
	code, body := a.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "backend: ovsdb unix:/run/openvswitch/db.sock: connection refused") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	// A FAILED operation needs an operator: not ready until rolled back.
	f.SetNotReady()
	f.FailNext(dataplane.MethodPrepare, errTest("chain missing"))
	f.FailNext(dataplane.MethodAbort, errTest("iptables locked"))
	_, err := a.client.Prepare(context.Background(), &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	wantStatus(t, err, codes.Internal, "chain missing", "iptables locked")
	if code, body := a.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "operation op-1 FAILED") {
		t.Fatalf("/readyz after a failed abort = %d %q", code, body)
	}
	if _, err := a.client.Rollback(context.Background(), &agentv1.RollbackRequest{OperationId: "op-1"}); err != nil {
		t.Fatal(err)
	}
	if code, body := a.get(t, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz after rollback = %d %q", code, body)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// TestBackendUnavailable runs the agent with the real OVS backend and no
// ovsdb-server: the agent still serves /healthz, /readyz and Info say why,
// and operations are refused.
func TestBackendUnavailable(t *testing.T) {
	testenv.RequirePrivileged(t, "iptables")
	cfg := testConfig(t)
	cfg.OVSDB = "unix:" + t.TempDir() + "/absent.sock"
	cfg.BackendRetry = 50 * time.Millisecond
	a := startAgent(t, cfg, nil)
	if code, _ := a.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	var code int
	var body string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if code, body = a.get(t, "/readyz"); strings.Contains(body, "absent.sock") {
			break // the backend is built and has been asked
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "ovsdb") || !strings.Contains(body, "absent.sock") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	ctx := context.Background()
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil || info.GetReady() || info.GetNode() != "node-1" || !strings.Contains(strings.Join(info.GetNotReady(), ";"), "absent.sock") {
		t.Fatalf("info: %v %v", info, err)
	}
	_, err = a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	if err == nil || !strings.Contains(err.Error(), "absent.sock") {
		t.Fatalf("Prepare without OVS: %v, want an error naming the ovsdb socket", err)
	}
}

// TestStopWithCallStreamOpen: an agent stopped (SIGTERM) while the
// coordinator's call stream is open stops at once, not after the shutdown
// deadline: its call streams end once their calls have answered
// (callstream.Server.Drain), where gRPC's GracefulStop would wait for them.
func TestStopWithCallStreamOpen(t *testing.T) {
	a := startAgent(t, testConfig(t), newFake())
	if _, err := a.client.Info(context.Background(), &agentv1.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a.cancel() // the connection and its stream stay open
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	a.stopped = true
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Run took %v to stop with a call stream open; want well under the 5 s shutdown deadline", took.Round(time.Millisecond))
	}
	if _, err := a.client.Info(context.Background(), &agentv1.InfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("call after the agent stopped: %v; want UNAVAILABLE", err)
	}
	a.conn.Close()
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, testConfig(t), newFake())
	a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-2", FromPort: 4789, ToPort: 4889}) // refused
	// A coordinator older than the call stream calls unary: counted alike.
	agentv1.NewAgentServiceClient(a.conn).Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-3", FromPort: 4789, ToPort: 4889}) // refused
	a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", DeadmanMillis: 50})
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := a.client.Status(ctx, &agentv1.StatusRequest{})
		if err != nil || st.GetPhase() == agentv1.Phase_PHASE_REVERTED || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	want := `
# HELP cutover_agent_build_info Always 1; the version label is the agent's build.
# TYPE cutover_agent_build_info gauge
cutover_agent_build_info{version="` + version.Version + `"} 1
# HELP cutover_agent_current_port VXLAN UDP port last read back from the dataplane.
# TYPE cutover_agent_current_port gauge
cutover_agent_current_port 4789
# HELP cutover_agent_deadman_reverts_total Committed changes the agent reverted by itself because no confirm came by the dead-man deadline.
# TYPE cutover_agent_deadman_reverts_total counter
cutover_agent_deadman_reverts_total 1
# HELP cutover_agent_operation_phase Phase of the current or last operation: 1 for the phase it is in, 0 for the others.
# TYPE cutover_agent_operation_phase gauge
cutover_agent_operation_phase{phase="aborted"} 0
cutover_agent_operation_phase{phase="committed"} 0
cutover_agent_operation_phase{phase="confirmed"} 0
cutover_agent_operation_phase{phase="failed"} 0
cutover_agent_operation_phase{phase="finalized"} 0
cutover_agent_operation_phase{phase="idle"} 0
cutover_agent_operation_phase{phase="prepared"} 0
cutover_agent_operation_phase{phase="preparing"} 0
cutover_agent_operation_phase{phase="reverted"} 1
`
	// The status says REVERTED as soon as the record does; the phase
	// gauge follows from the observer a moment later (a CI run read
	// "committed" there): poll the metrics too.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := testutil.GatherAndCompare(a.reg, strings.NewReader(want),
			"cutover_agent_build_info", "cutover_agent_current_port", "cutover_agent_deadman_reverts_total",
			"cutover_agent_operation_phase")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	// The health and status polls above make the other counts vary.
	for _, c := range []struct {
		method, code string
		n            float64
	}{{"Prepare", "OK", 1}, {"Prepare", "FailedPrecondition", 2}, {"Commit", "OK", 1}} {
		if v := gathered(t, a.reg, "cutover_agent_rpc_requests_total", "method", c.method, "code", c.code); v != c.n {
			t.Fatalf("rpc_requests_total{method=%s,code=%s} = %v, want %v", c.method, c.code, v, c.n)
		}
	}
	for _, h := range []string{"cutover_agent_apply_duration_seconds", "cutover_agent_commit_lateness_seconds"} {
		if n, err := testutil.GatherAndCount(a.reg, h); err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v", h, n, err)
		}
	}
	if problems, err := testutil.GatherAndLint(a.reg); err != nil || len(problems) != 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	code, body := a.get(t, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "cutover_agent_commit_lateness_seconds_count 1") {
		t.Fatalf("/metrics = %d\n%s", code, body)
	}
}

// TestMetricsLintFailingCase proves the lint check catches a bad metric, so
// a clean result above means something.
func TestMetricsLintFailingCase(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	bad := prometheus.NewCounter(prometheus.CounterOpts{Name: "cutover_agent_bad_Counter", Help: "x"})
	reg.MustRegister(bad)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) == 0 {
		t.Fatalf("promlint found nothing wrong with %s: %v", "cutover_agent_bad_Counter", err)
	}
}

func TestMetricsObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.PhaseChanged(operation.PhaseCommitted)
	m.Applied(2*time.Millisecond, 30*time.Microsecond)
	m.TLSRejected("wrong_role")
	if v := testutil.ToFloat64(m.phase.WithLabelValues("committed")); v != 1 {
		t.Fatalf("committed = %v", v)
	}
	if v := testutil.ToFloat64(m.phase.WithLabelValues("idle")); v != 0 {
		t.Fatalf("idle = %v", v)
	}
	if n := testutil.CollectAndCount(m.tlsRejections); n != 1 {
		t.Fatalf("tls rejections series = %d", n)
	}
}

// gathered returns the value of the counter or gauge name with the given
// label pairs, or -1 when there is no such series.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// keeperFake is a fake backend that keeps something of its own
// (dataplane.Keeper): it counts the Keep calls.
type keeperFake struct {
	*dataplane.Fake
	keeps chan struct{}
}

func (k keeperFake) Keep(context.Context) (bool, error) {
	k.keeps <- struct{}{}
	return true, nil
}

// TestKeeperKeptFromStart: a backend that keeps standing state (the OVS
// standing redirects) has Keep called once the backend is up, without an
// operation, so a staged operation finds it in place.
func TestKeeperKeptFromStart(t *testing.T) {
	k := keeperFake{Fake: newFake(), keeps: make(chan struct{}, 16)}
	a := startAgent(t, testConfig(t), k)
	select {
	case <-k.keeps:
	case <-time.After(10 * time.Second):
		t.Fatal("Keep not called within 10 s of the agent's start")
	}
	// Counted once Keep returned: cutover_agent_standing_checks_total,
	// result written (the fake always writes).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		const want = `
# HELP cutover_agent_standing_checks_total Checks of what the backend keeps between operations (the OVS standing redirect flows, --ovs-standing-redirects), by result: in_place, written (put back: removed by something else, stale, or in another interface's way; each is a flow table change), error.
# TYPE cutover_agent_standing_checks_total counter
cutover_agent_standing_checks_total{result="written"} 1
`
		err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "cutover_agent_standing_checks_total")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// portKeeperFake keeps the overlay port open (dataplane.PortKeeper) over
// a real Firewall on an iptables fake without the port's rule.
type portKeeperFake struct {
	*dataplane.Fake
	fw    *dataplane.Firewall
	stale chan bool
}

func (k portKeeperFake) KeepPortOpen(_ context.Context, removeStale bool) (dataplane.Kept, error) {
	kept, err := k.fw.KeepOpen(4789, removeStale)
	k.stale <- removeStale
	return kept, err
}

// TestPortKeptOpenFromStart: the agent opens the overlay's
// current port at start, before any operation, with no operation in
// flight (stale marks may go), and counts it as opened.
func TestPortKeptOpenFromStart(t *testing.T) {
	ipt := iptables.NewFake("")
	fw := &dataplane.Firewall{IPT: ipt, CreateChain: true, JumpFrom: "INPUT",
		Templates: []iptables.Rule{{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}}}
	k := portKeeperFake{Fake: newFake(), fw: fw, stale: make(chan bool, 16)}
	a := startAgent(t, testConfig(t), k)
	select {
	case stale := <-k.stale:
		if !stale {
			t.Error("KeepPortOpen at start without an operation: removeStale false")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("KeepPortOpen not called within 10 s of the agent's start")
	}
	if !strings.Contains(ipt.Dump(), "--dport 4789 -m comment --comment "+dataplane.KeepComment) {
		t.Fatalf("no marked rule for 4789:\n%s", ipt.Dump())
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		const want = `
# HELP cutover_agent_port_keep_checks_total Checks that the overlay's current port is open in the node firewall (at start, then every minute), by result: found (its rule was there), opened (the agent added its marked rule), error.
# TYPE cutover_agent_port_keep_checks_total counter
cutover_agent_port_keep_checks_total{result="opened"} 1
`
		err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "cutover_agent_port_keep_checks_total")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}
