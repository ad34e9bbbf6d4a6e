package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

var quiet = slog.New(slog.DiscardHandler)

// testAgent is one agent run in-process by Run, with a fake dataplane,
// gRPC over bufconn and HTTP on a loopback port.
type testAgent struct {
	cfg     Config
	fake    *dataplane.Fake
	reg     *prometheus.Registry
	client  agentv1.AgentServiceClient // over calls
	calls   *callstream.Conn
	conn    *grpc.ClientConn
	httpURL string
	done    chan error
	stopped bool
	cancel  context.CancelFunc
}

// stop ends Run now, as a SIGTERM would.
func (a *testAgent) stop(t *testing.T) {
	t.Helper()
	a.conn.Close()
	a.cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	a.stopped = true
}

func testConfig(t *testing.T) Config {
	cfg := Default()
	cfg.NodeName = "node-1"
	cfg.Insecure = true
	cfg.StateDir = t.TempDir()
	cfg.Labels = map[string]string{"zone": "a"}
	return cfg
}

// startAgent runs the agent until the test ends. backend nil means: build it
// from the config (NewBackend).
func startAgent(t *testing.T, cfg Config, backend dataplane.Backend, extra ...Option) *testAgent {
	t.Helper()
	a := &testAgent{cfg: cfg, reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	if f, ok := backend.(*dataplane.Fake); ok {
		a.fake = f
	}
	bl := bufconn.Listen(1 << 20)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.httpURL = "http://" + hl.Addr().String()
	opts := []Option{WithListeners(bl, hl), WithRegistry(a.reg), WithLogger(quiet)}
	if backend != nil {
		opts = append(opts, WithBackend(backend))
	}
	opts = append(opts, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- Run(ctx, cfg, opts...) }()
	a.conn, err = grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bl.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	// As the coordinator calls: over the call stream (pkg/callstream).
	a.calls = callstream.NewConn(a.conn, agentv1.AgentService_Calls_FullMethodName, callstream.Options{})
	a.client = agentv1.NewAgentServiceClient(a.calls)
	t.Cleanup(func() {
		if a.stopped {
			return
		}
		a.conn.Close()
		cancel()
		select {
		case err := <-a.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	if backend != nil {
		a.waitServing(t)
	}
	return a
}

// waitServing waits until the gRPC health service says the AgentService is
// serving (the backend and the machine are up).
func (a *testAgent) waitServing(t *testing.T) {
	t.Helper()
	hc := healthpb.NewHealthClient(a.conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: agentv1.AgentService_ServiceDesc.ServiceName})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not serving after 5s: %v %v", r, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (a *testAgent) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(a.httpURL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func wantStatus(t *testing.T, err error, code codes.Code, substr ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %s", err, code)
	}
	for _, s := range substr {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Fatalf("error %q does not mention %q", status.Convert(err).Message(), s)
		}
	}
}

func newFake() *dataplane.Fake { return dataplane.NewFake("ovs", "vxlan0", 4789) }

func TestServiceFullOperation(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, testConfig(t), newFake())

	pr, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if pr.GetStatus().GetPhase() != agentv1.Phase_PHASE_PREPARED {
		t.Fatalf("prepare: %v", pr)
	}
	if got := a.fake.Dump(); got != "port=4789 fw=[4789 4889]" {
		t.Fatalf("after prepare: %s", got)
	}
	at := time.Now().Add(30 * time.Millisecond)
	cr, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", AtUnixNano: at.UnixNano(), DeadmanMillis: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	late := time.Duration(cr.GetAppliedUnixNano() - at.UnixNano())
	t.Logf("commit applied %v after the requested instant (apply %v)", late, time.Duration(cr.GetApplyNanos()))
	if late < 0 || cr.GetReadbackPort() != 4889 || cr.GetStatus().GetPhase() != agentv1.Phase_PHASE_COMMITTED ||
		cr.GetStatus().GetDeadlineUnixNano() != cr.GetAppliedUnixNano()+10_000*int64(time.Millisecond) {
		t.Fatalf("commit: %v", cr)
	}
	// Replay: the stored result, no second apply.
	cr2, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", AtUnixNano: at.UnixNano(), DeadmanMillis: 10_000})
	if err != nil || cr2.GetAppliedUnixNano() != cr.GetAppliedUnixNano() {
		t.Fatalf("commit replay: %v %v", cr2, err)
	}
	st, err := a.client.Confirm(ctx, &agentv1.ConfirmRequest{OperationId: "op-1"})
	if err != nil || st.GetPhase() != agentv1.Phase_PHASE_CONFIRMED {
		t.Fatalf("confirm: %v %v", st, err)
	}
	st, err = a.client.Finalize(ctx, &agentv1.FinalizeRequest{OperationId: "op-1"})
	if err != nil || st.GetPhase() != agentv1.Phase_PHASE_FINALIZED {
		t.Fatalf("finalize: %v %v", st, err)
	}
	if got := a.fake.Dump(); got != "port=4889 fw=[4889]" {
		t.Fatalf("after finalize: %s", got)
	}
	if got, want := a.fake.Calls(), []string{"Prepare 4789->4889", "Commit 4789->4889", "Finalize 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	st, err = a.client.Status(ctx, &agentv1.StatusRequest{})
	if err != nil || st.GetOperationId() != "op-1" || st.GetCurrentPort() != 4889 {
		t.Fatalf("status: %v %v", st, err)
	}
}

func TestServiceRollbackAndReplays(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, testConfig(t), newFake())
	for range 2 {
		if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4999})
	wantStatus(t, err, codes.InvalidArgument, "op-1", "4789 -> 4889", "4789 -> 4999")
	_, err = a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-2", FromPort: 4789, ToPort: 4999})
	wantStatus(t, err, codes.FailedPrecondition, "operation op-1 is in flight")
	if _, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		st, err := a.client.Rollback(ctx, &agentv1.RollbackRequest{OperationId: "op-1", Reason: "verify failed on node-3"})
		if err != nil || st.GetPhase() != agentv1.Phase_PHASE_REVERTED || st.GetRevertedBy() != "rollback" || st.GetCurrentPort() != 4789 {
			t.Fatalf("rollback: %v %v", st, err)
		}
	}
	if got := a.fake.Dump(); got != "port=4789 fw=[4789]" {
		t.Fatalf("after rollback: %s", got)
	}
	if got, want := a.fake.Calls(), []string{"Prepare 4789->4889", "Commit 4789->4889", "Revert 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// The rolled-back operation no longer blocks a new one.
	if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-2", FromPort: 4789, ToPort: 4999}); err != nil {
		t.Fatal(err)
	}
	st, err := a.client.Rollback(ctx, &agentv1.RollbackRequest{OperationId: "op-2"})
	if err != nil || st.GetPhase() != agentv1.Phase_PHASE_ABORTED {
		t.Fatalf("rollback prepared: %v %v", st, err)
	}
}

func TestServiceDeadmanRevert(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, testConfig(t), newFake())
	a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	if _, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", DeadmanMillis: 100}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	var st *agentv1.OperationStatus
	for {
		var err error
		st, err = a.client.Status(ctx, &agentv1.StatusRequest{OperationId: "op-1"})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetPhase() == agentv1.Phase_PHASE_REVERTED || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.GetPhase() != agentv1.Phase_PHASE_REVERTED || st.GetRevertedBy() != "deadman" || st.GetCurrentPort() != 4789 {
		t.Fatalf("after the dead-man deadline: %v", st)
	}
	_, err := a.client.Confirm(ctx, &agentv1.ConfirmRequest{OperationId: "op-1"})
	wantStatus(t, err, codes.FailedPrecondition, "already reverted by deadman at")
	if got := a.fake.Dump(); got != "port=4789 fw=[4789]" {
		t.Fatalf("after dead-man: %s", got)
	}
}

func TestServiceValidation(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, testConfig(t), newFake())
	long := strings.Repeat("x", MaxOpIDLen+1)
	cases := []struct {
		name   string
		call   func() error
		substr []string
	}{
		{"empty op id", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{FromPort: 4789, ToPort: 4889})
			return err
		}, []string{"operation_id", "required"}},
		{"op id charset", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op 1/../x", FromPort: 4789, ToPort: 4889})
			return err
		}, []string{"operation_id", `"op 1/../x"`, "only letters"}},
		{"op id length", func() error {
			_, err := a.client.Confirm(ctx, &agentv1.ConfirmRequest{OperationId: long})
			return err
		}, []string{"operation_id", "129 characters, at most 128"}},
		{"from port 0", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op", FromPort: 0, ToPort: 4889})
			return err
		}, []string{"from_port 0", "1-65535"}},
		{"to port too big", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op", FromPort: 4789, ToPort: 70000})
			return err
		}, []string{"to_port 70000", "1-65535"}},
		{"from equals to", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op", FromPort: 4789, ToPort: 4789})
			return err
		}, []string{"to_port 4789", "equal to from_port"}},
		{"negative deadman", func() error {
			_, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op", DeadmanMillis: -1})
			return err
		}, []string{"deadman_millis -1", "negative"}},
		{"deadman too long", func() error {
			_, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op", DeadmanMillis: 2 * 3600 * 1000})
			return err
		}, []string{"deadman_millis 7200000", "--max-deadman 1h0m0s"}},
		{"commit too far ahead", func() error {
			_, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op", AtUnixNano: time.Now().Add(time.Hour).UnixNano()})
			return err
		}, []string{"at_unix_nano", "--max-commit-delay 10m0s", "clock offset"}},
		{"negative at", func() error {
			_, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op", AtUnixNano: -5})
			return err
		}, []string{"at_unix_nano -5", "negative"}},
		{"preflight port", func() error {
			_, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{TargetPort: 0})
			return err
		}, []string{"target_port 0"}},
		{"prepare strategy", func() error {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op", FromPort: 4789, ToPort: 4889, Strategy: "slow"})
			return err
		}, []string{`strategy "slow"`, "atomic", "staged"}},
		{"preflight strategy", func() error {
			_, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{TargetPort: 4889, Strategy: "slow"})
			return err
		}, []string{`strategy "slow"`}},
		{"rollback reason too long", func() error {
			_, err := a.client.Rollback(ctx, &agentv1.RollbackRequest{OperationId: "op", Reason: strings.Repeat("r", 2000)})
			return err
		}, []string{"reason", "at most 1024"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantStatus(t, c.call(), codes.InvalidArgument, c.substr...) })
	}
	if len(a.fake.Calls()) != 0 {
		t.Fatalf("bad requests reached the dataplane: %q", a.fake.Calls())
	}
	_, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "never-prepared"})
	wantStatus(t, err, codes.NotFound, "never-prepared", "prepare it first")
}

func TestServiceInfoPreflightClockProbeStats(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	f.SetHolder(4999, "udp socket of pid 42 (someprog)")
	a := startAgent(t, testConfig(t), f)
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetNode() != "node-1" || info.GetBackend() != "ovs" || info.GetDevice() != "vxlan0" || info.GetCurrentPort() != 4789 ||
		!info.GetReady() || info.GetLabels()["zone"] != "a" || info.GetVersion() == "" || info.GetOperation().GetPhase() != agentv1.Phase_PHASE_IDLE {
		t.Fatalf("info: %v", info)
	}
	pf, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{TargetPort: 4999})
	if err != nil || pf.GetTargetPortFree() || !strings.Contains(pf.GetTargetPortUser(), "pid 42") || len(pf.GetProblems()) != 1 {
		t.Fatalf("preflight busy port: %v %v", pf, err)
	}
	a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	pf, err = a.client.Preflight(ctx, &agentv1.PreflightRequest{OperationId: "op-2", TargetPort: 4889})
	if err != nil || !slices.ContainsFunc(pf.GetProblems(), func(p string) bool { return strings.Contains(p, "operation op-1 in flight") }) {
		t.Fatalf("preflight with an op in flight: %v %v", pf, err)
	}
	// Info rides along (one call per node in the coordinator's preflight).
	if in := pf.GetInfo(); in.GetNode() != "node-1" || in.GetCurrentPort() != 4789 || in.GetOperation().GetOperationId() != "op-1" || in.GetOperation().GetPhase() != agentv1.Phase_PHASE_PREPARED {
		t.Fatalf("preflight's info: %v", in)
	}
	if len(a.fake.Calls()) != 1 {
		t.Fatalf("preflight changed something: %q", a.fake.Calls())
	}
	info, _ = a.client.Info(ctx, &agentv1.InfoRequest{})
	if info.GetOperation().GetOperationId() != "op-1" || info.GetOperation().GetPhase() != agentv1.Phase_PHASE_PREPARED {
		t.Fatalf("info operation: %v", info.GetOperation())
	}
	before := time.Now().UnixNano()
	ck, err := a.client.Clock(ctx, &agentv1.ClockRequest{})
	if err != nil || ck.GetUnixNano() < before || ck.GetUnixNano() > time.Now().UnixNano() {
		t.Fatalf("clock: %v %v", ck, err)
	}
	ps, err := a.client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{})
	if err != nil || ps.GetNode() != "node-1" {
		t.Fatalf("probe stats: %v %v", ps, err)
	}
}

func TestServiceUnwritableStateDir(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(file, "state")
	a := startAgent(t, cfg, newFake())
	_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	wantStatus(t, err, codes.Unavailable, cfg.StateDir, "ENOTDIR", "refused before any change")
	if len(a.fake.Calls()) != 0 || a.fake.Dump() != "port=4789 fw=[4789]" {
		t.Fatalf("dataplane touched: %q %s", a.fake.Calls(), a.fake.Dump())
	}
	code, body := a.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "state dir") || !strings.Contains(body, "ENOTDIR") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	info, _ := a.client.Info(ctx, &agentv1.InfoRequest{})
	if info.GetReady() || len(info.GetNotReady()) == 0 {
		t.Fatalf("info: %v", info)
	}
}

func TestServiceHealthAndReflection(t *testing.T) {
	a := startAgent(t, testConfig(t), newFake())
	r, err := healthpb.NewHealthClient(a.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	if got := listServices(t, a.conn); !slices.Contains(got, "cutover.agent.v1.AgentService") || !slices.Contains(got, "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %q", got)
	}
}

// TestRestartKeepsDeadline stops the agent right after a commit and starts
// a new one over the same state dir and dataplane: the dead-man deadline
// survives the restart and the new agent reverts by itself.
func TestRestartKeepsDeadline(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	f := newFake()
	a := startAgent(t, cfg, f)
	a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-1", FromPort: 4789, ToPort: 4889})
	cr, err := a.client.Commit(ctx, &agentv1.CommitRequest{OperationId: "op-1", DeadmanMillis: 300})
	if err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	if f.Port() != 4889 {
		t.Fatalf("stopping the agent changed the dataplane: %s", f.Dump())
	}
	b := startAgent(t, cfg, f)
	st, err := b.client.Status(ctx, &agentv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetPhase() != agentv1.Phase_PHASE_COMMITTED || st.GetDeadlineUnixNano() != cr.GetStatus().GetDeadlineUnixNano() {
		t.Fatalf("after restart: %v, want COMMITTED with deadline %d", st, cr.GetStatus().GetDeadlineUnixNano())
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, _ = b.client.Status(ctx, &agentv1.StatusRequest{}); st.GetPhase() == agentv1.Phase_PHASE_REVERTED {
			break
		}
	}
	if st.GetPhase() != agentv1.Phase_PHASE_REVERTED || st.GetRevertedBy() != "deadman" || f.Dump() != "port=4789 fw=[4789]" {
		t.Fatalf("restarted agent did not revert at the deadline: %v, %s", st, f.Dump())
	}
}

// TestConcurrentPrepares sends two operations at once: exactly one is
// prepared and the other is refused naming it.
func TestConcurrentPrepares(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	f.SetLatency(dataplane.MethodPrepare, 20*time.Millisecond) // widen the window
	a := startAgent(t, testConfig(t), f)
	errs := make(chan error, 2)
	for _, id := range []string{"op-a", "op-b"} {
		go func() {
			_, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: id, FromPort: 4789, ToPort: 4889})
			errs <- err
		}()
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("want exactly one prepared: %v, %v", e1, e2)
	}
	refused := e1
	if refused == nil {
		refused = e2
	}
	st, _ := a.client.Status(ctx, &agentv1.StatusRequest{})
	wantStatus(t, refused, codes.FailedPrecondition, "operation "+st.GetOperationId()+" is in flight")
	if len(f.Calls()) != 1 {
		t.Fatalf("calls %q", f.Calls())
	}
}

// TestServiceStagedPreflight: a staged preflight gives the backend's
// staged actions, and its refusal, by name.
func TestServiceStagedPreflight(t *testing.T) {
	ctx := context.Background()
	fake := newFake()
	a := startAgent(t, testConfig(t), fake)
	pf, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{TargetPort: 4889, Strategy: "staged"})
	if err != nil || len(pf.Problems) != 0 || len(pf.Actions) != 3 || !strings.Contains(pf.Actions[0], "receive on 4889 beside 4789") {
		t.Fatalf("staged preflight: %v %v", pf, err)
	}
	// The fake backend has no measure of the staged strategy against the
	// atomic one (dataplane.StagedAdvisor): strategy auto must not pick
	// staged for it, and the note says why.
	if pf.StagedLosesLess || !strings.Contains(pf.StrategyNote, "no measure") {
		t.Fatalf("staged preflight of a backend without advice: staged_loses_less %v, note %q", pf.StagedLosesLess, pf.StrategyNote)
	}
	fake.SetStagedRefusal("openshift-sdn: refused for the test")
	pf, err = a.client.Preflight(ctx, &agentv1.PreflightRequest{TargetPort: 4889, Strategy: "staged"})
	if err != nil || len(pf.Problems) != 1 || pf.Problems[0] != "openshift-sdn: refused for the test" {
		t.Fatalf("staged preflight refused: %v %v", pf, err)
	}
	if len(fake.Calls()) != 0 {
		t.Fatalf("preflight acted: %q", fake.Calls())
	}
}

// TestServiceStagedPreflightCarriesAtomic: a staged preflight also says
// what the atomic one would answer (PreflightResponse.atomic): its
// problems, those staged shares and none that only staged has, those
// found after the backend's check included, and the flip's actions.
// Strategy auto judges either strategy from it, one call per node.
func TestServiceStagedPreflightCarriesAtomic(t *testing.T) {
	ctx := context.Background()
	fake := newFake()
	a := startAgent(t, testConfig(t), fake)
	if _, err := a.client.Prepare(ctx, &agentv1.PrepareRequest{OperationId: "op-held", FromPort: 4789, ToPort: 4989}); err != nil {
		t.Fatal(err)
	}
	fake.SetHolder(4889, "dnsmasq")
	fake.SetStagedRefusal("openshift-sdn: refused for the test")
	staged, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{OperationId: "op-2", TargetPort: 4889, Strategy: "staged"})
	if err != nil {
		t.Fatal(err)
	}
	atomic, err := a.client.Preflight(ctx, &agentv1.PreflightRequest{OperationId: "op-2", TargetPort: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if len(atomic.Problems) != 2 || !slices.Contains(staged.Problems, "openshift-sdn: refused for the test") || len(staged.Problems) != 3 {
		t.Fatalf("want the port's holder and op-held in flight in both, the refusal in staged's alone: atomic %q, staged %q", atomic.Problems, staged.Problems)
	}
	if got := staged.GetAtomic(); got == nil || !slices.Equal(got.Problems, atomic.Problems) || !slices.Equal(got.Actions, atomic.Actions) || slices.Equal(staged.Actions, atomic.Actions) {
		t.Fatalf("staged preflight's atomic judgement %v, want the atomic preflight's problems %q and actions %q (staged's actions %q differ)", got, atomic.Problems, atomic.Actions, staged.Actions)
	}
	if atomic.Atomic != nil {
		t.Fatalf("atomic preflight carries an atomic judgement: %v", atomic.Atomic)
	}
}
