package coordinator

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/pkg/pki"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

var unavailable = status.Error(codes.Unavailable, "connection refused (agent restarting)")

// An agent that is only restarting (its calls refused for 400 ms) is
// reached by a later, spaced attempt of the rollback: the operation ends
// rolled back, not FAILED, and the retries were spaced (back-off).
func TestRollbackRetriesReachARestartingAgent(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Err: unavailable})
	l.fakes["n2"].SetFault("Rollback", fakeagent.Fault{Err: unavailable})
	rollbacks := func() int {
		n := 0
		for _, c := range l.fakes["n2"].CallLog() {
			if strings.HasPrefix(c, "Rollback") {
				n++
			}
		}
		return n
	}
	go func() {
		// "Back" once two attempts have failed (counted, not timed: a
		// loaded machine delays the retries, not their count), so the
		// third, after the doubled back-off, reaches it.
		for rollbacks() < 2 {
			time.Sleep(time.Millisecond)
		}
		l.fakes["n2"].SetFault("Rollback", fakeagent.Fault{})
	}()
	start := time.Now()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s (%s), want rolled back\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	n := rollbacks()
	// Attempts at 0, 250 ms, 750 ms (back-off 250 ms doubling): the third
	// reaches it. Back to back they would all have gone at once.
	if n != 3 || time.Since(start) < 700*time.Millisecond {
		t.Errorf("n2 got %d Rollback calls in %s, want 3 spaced over ≥ 750 ms", n, time.Since(start))
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "retrying n2 in 250ms") {
		t.Errorf("no retry event:\n%s", strings.Join(msgs, "\n"))
	}
	// The other agents got one Rollback each: retries go to the unreached.
	for _, c := range l.fakes["n1"].CallLog() {
		if c == "Rollback op1" {
			n--
		}
	}
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=ABORTED
		n3 port=4789 op=op1 phase=REVERTED`)
}

// An agent that stays unreachable: retries span the dead-man (+1 s), then
// FAILED naming the node, how long it was tried and when it undoes the
// operation by itself.
func TestRollbackFailsNamingNodeAndWhenItUndoes(t *testing.T) {
	l := newLab(t, 3, nil)
	l.crash()
	l.cfg = func(c *Config) { c.StepTimeout, c.Deadman = 300*time.Millisecond, time.Second }
	l.start()
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Err: unavailable})
	l.fakes["n2"].SetFault("Rollback", fakeagent.Fault{Err: unavailable})
	l.fakes["n2"].SetFault("Status", fakeagent.Fault{Err: unavailable})
	start := time.Now()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if rep.State != coordinatorv1.OperationState_OPERATION_STATE_FAILED {
		t.Fatalf("state %s (%s), want FAILED\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	for _, w := range []string{"rollback could not reach n2", "attempts over", "n2: state unknown: if it committed, its dead-man reverts it at", "prepare deadline"} {
		if !strings.Contains(rep.Error, w) {
			t.Errorf("report error does not say %q:\n%s", w, rep.Error)
		}
	}
	if took < 2*time.Second {
		t.Errorf("FAILED after %s: the retries must span the dead-man (1 s) + 1 s", took)
	}
	t.Logf("FAILED after %s: %s", took.Round(time.Millisecond), rep.Error)
}

// The agent's Status is read when a Rollback call fails: an agent that
// reports the operation undone counts as reached.
func TestRollbackCountsAnAgentThatUndidItself(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Err: unavailable})
	// Rollback fails after taking effect (its answer lost): Status says ABORTED.
	l.fakes["n2"].SetFault("Rollback", fakeagent.Fault{Err: status.Error(codes.Internal, "answer lost"), After: true})
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s (%s)\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	n := 0
	for _, c := range l.fakes["n2"].CallLog() {
		if strings.HasPrefix(c, "Rollback") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("n2 got %d Rollback calls, want 1 (its Status said ABORTED)", n)
	}
}

// slowProbes is a fake agent whose ProbeStats reset hangs (a frozen agent).
type slowProbes struct{ *fakeagent.Agent }

func (s slowProbes) ProbeStats(ctx context.Context, r *agentv1.ProbeStatsRequest) (*agentv1.ProbeStatsResponse, error) {
	if r.Reset_ {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Agent.ProbeStats(ctx, r)
}

// A frozen agent's probe counters reset neither delays Prepare by a step
// nor stops the operation: it is bounded (1 s) and reported.
func TestProbeResetBoundedAndReported(t *testing.T) {
	fakes := map[string]*fakeagent.Agent{}
	svcs := map[string]agentv1.AgentServiceServer{}
	for _, n := range []string{"n1", "n2", "n3"} {
		fakes[n] = fakeagent.New(n, fromPort)
		svcs[n] = fakes[n]
	}
	// An agent older than Prepare's reset_probe_stats: it is reset by a
	// ProbeStats call of its own, which hangs.
	fakes["n3"].SetOldPrepare(true)
	svcs["n3"] = slowProbes{fakes["n3"]}
	l := newLab(t, 3, svcs)
	l.fakes = fakes
	l.crash()
	l.cfg = func(c *Config) { c.StepTimeout, c.Deadman = 5*time.Second, 20*time.Second }
	l.start()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s (%s)\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	for _, p := range rep.Phases {
		if p.Phase == "prepare" && time.Duration(p.Nanos) > 2500*time.Millisecond {
			t.Errorf("prepare took %s: the reset of a frozen agent held it (step 5 s)", time.Duration(p.Nanos))
		}
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "probe counters of n3") {
		t.Errorf("the failed reset is not reported:\n%s", strings.Join(msgs, "\n"))
	}
}

// The disruption is read when an operation that reached commit is rolled
// back, not only at finalize.
func TestProbeStatsReadOnRollback(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n1"].SetPeers([]*agentv1.PeerProbeStats{{Peer: "n2", Sent: 50, Received: 47, Lost: 3, LongestGapMicros: 9000}})
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Err: status.Error(codes.Internal, "ovsdb transaction failed")})
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack || rep.ProbesSent != 50 || rep.ProbesLost != 3 || len(rep.Disruption) != 6 {
		t.Errorf("state %s, probes sent %d lost %d pairs %d: want rolled back with n1's figures", rep.State, rep.ProbesSent, rep.ProbesLost, len(rep.Disruption))
	}
}

// A target that is another tunnel's port (4789, IANA VXLAN) but also the
// current port is refused as the current port.
func TestTargetEqualToCurrentTunnelPort(t *testing.T) {
	l := newLab(t, 3, nil)
	_, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4789})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is the current port") {
		t.Errorf("got %v, want InvalidArgument saying it is the current port", err)
	}
	// Not the current port: the tunnel message stays.
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 6081})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "another tunnel") {
		t.Errorf("6081: got %v", err)
	}
	l.nobodyGot("Prepare")
}

// A second coordinator on the same --state-dir refuses to start, naming
// the holder's PID; once the first is closed, it starts.
func TestStateDirLocked(t *testing.T) {
	l := newLab(t, 2, nil)
	cfg := l.testConfig()
	_, err := New(cfg, l.inv)
	if !IsStateDirLocked(err) || !strings.Contains(err.Error(), "PID "+strconv.Itoa(os.Getpid())) || !strings.Contains(err.Error(), cfg.StateDir) {
		t.Fatalf("second coordinator on the same state dir: %v, want refused naming PID %d", err, os.Getpid())
	}
	b, _ := os.ReadFile(filepath.Join(cfg.StateDir, LockFile))
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file %q, want our PID", b)
	}
	l.crash()
	c, err := New(cfg, l.inv)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	c.Close()
}

// The API server counts refused clients: plaintext, no certificate, a
// wrong role. The count is per refused handshake, with its reason.
func TestAPIServerCountsTLSRejections(t *testing.T) {
	dir := t.TempDir()
	if err := pki.Issue(dir, pki.IssueOptions{Agents: []pki.AgentIdentity{{Name: "n1"}}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.TLS = pki.CoordinatorFiles(dir)
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", ""
	m := NewMetrics()
	s, err := Listen(cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Stop()
	addr := s.Addrs()[0].String()
	call := func(creds credentials.TransportCredentials) {
		t.Helper()
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cc.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := coordinatorv1.NewCoordinatorServiceClient(cc).ListAgents(ctx, &coordinatorv1.ListAgentsRequest{}, grpc.WaitForReady(false)); err == nil {
			t.Error("accepted")
		}
	}
	count := func(reason string) float64 { return testutil.ToFloat64(m.TLSRejected.WithLabelValues(reason)) }
	waitCount := func(reason string, want float64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for count(reason) < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := count(reason); got < want {
			t.Errorf("%s: counted %g, want %g", reason, got, want)
		}
	}
	// Plaintext: raw bytes, one connection, so exactly one count.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	_, _ = io.ReadAll(c)
	_ = c.Close()
	waitCount(pki.ReasonNotTLS, 1)
	call(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})) //nolint:gosec // the point: no client certificate
	waitCount(pki.ReasonNoCertificate, 1)
	agentTLS, err := pki.ClientConfig(pki.AgentFiles(dir, "n1"), pki.RoleCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	call(credentials.NewTLS(agentTLS))
	waitCount(pki.ReasonWrongRole, 1)
	// A connection that sends nothing (a TCP health check) is not a refusal.
	before := count(pki.ReasonHandshake) + count(pki.ReasonNotTLS)
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if after := count(pki.ReasonHandshake) + count(pki.ReasonNotTLS); after != before {
		t.Errorf("an empty connection was counted (%g → %g)", before, after)
	}
}

// TestProbeResetRidesInPrepare: the first Prepare carries the probe
// counters' reset; an agent that did it gets no ProbeStats call before
// commit, and one older than the field (it ignores it) gets exactly one,
// with reset. Every agent's counters are zeroed once.
func TestProbeResetRidesInPrepare(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n3"].SetOldPrepare(true)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s (%s)\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	for n, want := range map[string]int{"n1": 1, "n2": 1, "n3": 1} {
		if got := l.fakes[n].ProbeResets(); got != want {
			t.Errorf("%s: counters zeroed %d times, want %d", n, got, want)
		}
	}
	// The old agent's reset is a ProbeStats call of its own; the others'
	// rode in Prepare. (The reads after commit are not compared: the mesh
	// verifier polls a sender again while its pairs are not yet
	// conclusive, and a CI run read n1 once more than n3.)
	for n, want := range map[string]int{"n1": 0, "n2": 0, "n3": 1} {
		if got := l.fakes[n].ProbeStatsResetCalls(); got != want {
			t.Errorf("%s: ProbeStats calls that reset %d, want %d", n, got, want)
		}
	}
}
