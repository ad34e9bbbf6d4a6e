package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

var (
	succeeded  = coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED
	aborted    = coordinatorv1.OperationState_OPERATION_STATE_ABORTED
	rolledBack = coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK
)

func TestCutoverHappy(t *testing.T) {
	l := newLab(t, 4, nil)
	// Skewed agent clocks: the commit instant is converted per agent, so
	// the applied instants still agree in the coordinator's clock.
	l.fakes["n1"].SetSkew(250 * time.Millisecond)
	l.fakes["n2"].SetSkew(-400 * time.Millisecond)
	// n3's worst gap begins after every phase but the last one ended: the
	// report places it in the phase running when the counters are read.
	gapFrom := time.Now().Add(time.Hour)
	// Its two lost probes: one sent an hour before the operation, one with
	// the gap (the report counts each in the phase it was sent in).
	before := time.Now().Add(-time.Hour).UnixNano()
	l.fakes["n3"].SetPeers([]*agentv1.PeerProbeStats{{Peer: "n4", Sent: 100, Received: 98, Lost: 2, LongestGapMicros: 1500, LongestGapFromUnixNano: gapFrom.UnixNano(),
		LossRuns: []*agentv1.LossRun{{FirstSentUnixNano: before, LastSentUnixNano: before, Count: 1}, {FirstSentUnixNano: gapFrom.UnixNano(), LastSentUnixNano: gapFrom.UnixNano(), Count: 1}}}})
	l.fakes["n3"].SetStall(42 * time.Millisecond) // its agent fell behind its mesh
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s (%s)\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	wantDump(t, l.dump(), `
		n1 port=4889 op=op1 phase=FINALIZED
		n2 port=4889 op=op1 phase=FINALIZED
		n3 port=4889 op=op1 phase=FINALIZED
		n4 port=4889 op=op1 phase=FINALIZED`)
	l.everyoneGot("Confirm")
	l.everyoneGot("Finalize")
	if rep.FromPort != 4789 || rep.ToPort != 4889 {
		t.Errorf("ports %d→%d", rep.FromPort, rep.ToPort)
	}
	// The skews are hundreds of ms; the spread after correction must be a
	// few ms at most (in-process, loaded CI: allow 20 ms).
	if rep.CommitSpreadNanos <= 0 || rep.CommitSpreadNanos > int64(20*time.Millisecond) {
		t.Errorf("commit spread %s, want (0, 20ms]", time.Duration(rep.CommitSpreadNanos))
	}
	checkCommitMargin(t, rep)
	var phases []string
	for _, p := range rep.Phases {
		phases = append(phases, p.Phase)
	}
	if got := strings.Join(phases, ","); got != "preflight,prepare,commit,verify,confirm,finalize" {
		t.Errorf("phases %s", got)
	}
	for _, n := range rep.Nodes {
		if n.Port != 4889 || n.AgentPhase != "PHASE_FINALIZED" || n.AppliedUnixNano == 0 || n.Error != "" {
			t.Errorf("node result %v", n)
		}
		if want := map[string]int64{"n3": 42000}[n.Node]; n.ProbeStallMicros != want {
			t.Errorf("%s: probe stall %d µs, want %d (what its agent said)", n.Node, n.ProbeStallMicros, want)
		}
	}
	if rep.ProbesSent != 100 || rep.ProbesLost != 2 || rep.LongestGapMicros != 1500 || len(rep.Disruption) != 12 || len(rep.Warnings) != 0 {
		t.Errorf("disruption: sent %d lost %d gap %d pairs %v", rep.ProbesSent, rep.ProbesLost, rep.LongestGapMicros, rep.Disruption)
	}
	for _, d := range rep.Disruption {
		if d.From != "n3" || d.To != "n4" {
			continue
		}
		if off := time.Duration(d.LongestGapFromUnixNano - gapFrom.UnixNano()).Abs(); d.LongestGapPhase != "finalize" || off > 50*time.Millisecond {
			t.Errorf("n3→n4 worst gap: phase %q, %v off what the agent said", d.LongestGapPhase, off)
		}
		if got := fmt.Sprint(d.LostByPhase); !strings.Contains(got, `lost:1`) || len(d.LostByPhase) != 2 || d.LostByPhase[0].Phase != "" || d.LostByPhase[1].Phase != "finalize" {
			t.Errorf("n3→n4 lost by phase %s, want 1 before the operation and 1 in the finalize", got)
		}
	}
	st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{})
	if err != nil || st.OperationId != "op1" || st.State != succeeded {
		t.Errorf("status: %v %v", st, err)
	}
	if problems, err := testutil.GatherAndLint(l.c.Metrics().Registry); err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
	if got := testutil.ToFloat64(l.c.metrics.Operations.WithLabelValues("succeeded")); got != 1 {
		t.Errorf("operations_total{succeeded} = %v", got)
	}
	if got := testutil.ToFloat64(l.c.metrics.Phase.WithLabelValues("idle")); got != 1 {
		t.Errorf("phase{idle} = %v", got)
	}
}

// TestAgentsOlderThanTheCallStream: a fleet where some agents have no
// call stream (an agent older than pkg/callstream, or mid-upgrade) is
// called unary there and over the stream elsewhere, through a whole
// cutover, and the failure of a call keeps its status either way.
func TestAgentsOlderThanTheCallStream(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n1"].SetUnaryOnly(true)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s (%s)\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	wantDump(t, l.dump(), `
		n1 port=4889 op=op1 phase=FINALIZED
		n2 port=4889 op=op1 phase=FINALIZED
		n3 port=4889 op=op1 phase=FINALIZED`)
	for _, n := range []string{"n1", "n2"} {
		l.fakes[n].SetFault("Prepare", fakeagent.Fault{Err: status.Error(codes.Internal, "iptables: permission denied on "+n)})
	}
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4789, OperationId: "op2", AllowTunnelPort: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != aborted {
		t.Fatalf("state %s (%s), want ABORTED\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	for _, n := range []string{"n1", "n2"} {
		if !slices.ContainsFunc(msgs, func(m string) bool {
			return strings.HasSuffix(m, "prepare failed: Internal: iptables: permission denied on "+n)
		}) {
			t.Errorf("no event names %s's refusal with its code and message\n%s", n, strings.Join(msgs, "\n"))
		}
	}
}

func TestPrepareFailureAborts(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFault("Prepare", fakeagent.Fault{Err: status.Error(codes.Internal, "iptables: permission denied")})
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != aborted || !strings.Contains(rep.Error, "n2") || !strings.Contains(rep.Error, "permission denied") {
		t.Fatalf("state %s error %q\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	l.nobodyGot("Commit") // I2
	l.everyoneGot("Rollback")
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=ABORTED
		n2 port=4789
		n3 port=4789 op=op1 phase=ABORTED`)
}

func TestPrepareTimeoutAborts(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n3"].SetFault("Prepare", fakeagent.Fault{Delay: 5 * time.Second})
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1", TimeoutMillis: 300})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != aborted {
		t.Fatalf("state %s %s", rep.State, rep.Error)
	}
	l.nobodyGot("Commit")
	l.everyoneGot("Rollback")
}

func TestCommitFailureRollsBack(t *testing.T) {
	l := newLab(t, 3, nil)
	// n2 applies, then its answer is lost: it must be rolled back too.
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{After: true, Err: status.Error(codes.Unavailable, "connection reset")})
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	// I1: everyone back on one port.
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=REVERTED
		n3 port=4789 op=op1 phase=REVERTED`)
	l.nobodyGot("Confirm")
}

func TestVerifyFailureRollsBack(t *testing.T) {
	l := newLab(t, 3, nil)
	l.c.run.Verifier = VerifierFunc(func(context.Context, VerifyInput) error { return errors.New("probe mesh: n1→n3 lost 40 of 40") })
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack || !strings.Contains(rep.Error, "probe mesh") {
		t.Fatalf("state %s %q", rep.State, rep.Error)
	}
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=REVERTED
		n3 port=4789 op=op1 phase=REVERTED`)
	l.nobodyGot("Confirm")
}

func TestReadbackFailureRollsBack(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFightBack(true)
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack || !strings.Contains(rep.Error, "verify failed on n2") || !strings.Contains(rep.Error, "read back port 4789") {
		t.Fatalf("state %s %q", rep.State, rep.Error)
	}
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=REVERTED
		n3 port=4789 op=op1 phase=REVERTED`)
	l.nobodyGot("Confirm")
}

func TestOperatorRollbackAfterSuccess(t *testing.T) {
	l := newLab(t, 3, nil)
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded {
		t.Fatalf("%v %v", rep, err)
	}
	st, err := l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	// The nodes are finalized on 4889 and the old port's rules are gone:
	// the rollback is a reverse cutover with its own barrier.
	rep, _, err = drain(st)
	if err != nil || rep.State != succeeded || rep.Kind != "rollback" || rep.RevertsOperationId != "op1" ||
		rep.FromPort != 4889 || rep.ToPort != 4789 || rep.OperationId == "op1" {
		t.Fatalf("%v %v", rep, err)
	}
	rid := rep.OperationId
	wantDump(t, l.dump(), `
		n1 port=4789 op=`+rid+` phase=FINALIZED
		n2 port=4789 op=`+rid+` phase=FINALIZED
		n3 port=4789 op=`+rid+` phase=FINALIZED`)
	// Rolling back the rollback is refused: it would silently redo the change.
	st, _ = l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{})
	if _, _, err = drain(st); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is the rollback of op1") {
		t.Fatalf("rollback of the rollback: %v", err)
	}
	// Rolling op1 back again is refused by preflight: the nodes are on 4789.
	st, _ = l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "op1"})
	if _, _, err = drain(st); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second rollback of op1: %v", err)
	}
}

func TestBadInputs(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n3"].HoldPort(4999, "pid 42 (dnsmasq)")
	cases := []struct {
		name  string
		req   *coordinatorv1.CutoverRequest
		setup func()
		code  codes.Code
		want  []string
	}{
		{"no port", &coordinatorv1.CutoverRequest{}, nil, codes.InvalidArgument, []string{"port 0", "not set"}},
		{"port too big", &coordinatorv1.CutoverRequest{Port: 70000}, nil, codes.InvalidArgument, []string{"port 70000", "out of range", "1-65535"}},
		{"nodeport range", &coordinatorv1.CutoverRequest{Port: 30080}, nil, codes.InvalidArgument, []string{"port 30080", "NodePort", "allow_nodeport_range"}},
		{"geneve", &coordinatorv1.CutoverRequest{Port: 6081}, nil, codes.InvalidArgument, []string{"port 6081", "Geneve", "allow_tunnel_port"}},
		{"flannel", &coordinatorv1.CutoverRequest{Port: 8472}, nil, codes.InvalidArgument, []string{"port 8472", "allow_tunnel_port"}},
		{"current port", &coordinatorv1.CutoverRequest{Port: 4789, AllowTunnelPort: true}, nil, codes.FailedPrecondition, []string{"n1: already on port 4789"}},
		{"unknown node", &coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n1", "n9"}}, nil, codes.InvalidArgument, []string{"nodes n9", "not in the inventory"}},
		{"bad selector", &coordinatorv1.CutoverRequest{Port: 4889, Selector: "rack"}, nil, codes.InvalidArgument, []string{"selector", "key=value"}},
		{"empty selection", &coordinatorv1.CutoverRequest{Port: 4889, Selector: "rack=z"}, nil, codes.InvalidArgument, []string{"selector", "selects no agent"}},
		{"nodes and selector", &coordinatorv1.CutoverRequest{Port: 4889, Selector: "rack=a", Nodes: []string{"n1"}}, nil, codes.InvalidArgument, []string{"not both"}},
		{"negative timeout", &coordinatorv1.CutoverRequest{Port: 4889, TimeoutMillis: -1}, nil, codes.InvalidArgument, []string{"timeout_millis -1"}},
		{"bad id", &coordinatorv1.CutoverRequest{Port: 4889, OperationId: "../etc"}, nil, codes.InvalidArgument, []string{"operation_id", "../etc"}},
		{"port held", &coordinatorv1.CutoverRequest{Port: 4999}, nil, codes.FailedPrecondition, []string{"n3: target port 4999 is not free: held by pid 42 (dnsmasq)"}},
		{"bad strategy", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "slow"}, nil, codes.InvalidArgument, []string{`strategy "slow"`, "atomic", "staged"}},
		{"batches without staged", &coordinatorv1.CutoverRequest{Port: 4889, Batches: []string{"1"}}, nil, codes.InvalidArgument, []string{"batches", "only the staged strategy"}},
		{"max_parallel without staged", &coordinatorv1.CutoverRequest{Port: 4889, MaxParallel: 2}, nil, codes.InvalidArgument, []string{"max_parallel", "2", "only the staged strategy"}},
		{"staged subset, batch too big", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Nodes: []string{"n1"}, Batches: []string{"2"}}, nil, codes.InvalidArgument, []string{`batches[0] "2"`, "targets 1"}},
		{"batch zero", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"0", "100%"}}, nil, codes.InvalidArgument, []string{`batches[0] "0"`, "node count"}},
		{"batch percent", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"150%"}}, nil, codes.InvalidArgument, []string{`batches[0] "150%"`, "(0, 100]"}},
		{"batch too big", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"5"}}, nil, codes.InvalidArgument, []string{`batches[0] "5"`, "targets 3"}},
		{"batch shrinks", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"2", "1", "100%"}}, nil, codes.InvalidArgument, []string{`batches[1] "1"`, "must grow"}},
		{"batch short", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"1", "2"}}, nil, codes.InvalidArgument, []string{"covers 2 of the 3", "100%"}},
		{"drift", &coordinatorv1.CutoverRequest{Port: 4889}, func() { l.fakes["n2"].SetPort(4790) }, codes.FailedPrecondition, []string{"drift", "4789 on n1,n3", "4790 on n2"}},
		{"not ready", &coordinatorv1.CutoverRequest{Port: 4889}, func() { l.fakes["n2"].SetPort(4789); l.fakes["n1"].SetReady(false, "ovsdb") }, codes.FailedPrecondition, []string{"n1: agent not ready: ovsdb"}},
		{"unreachable", &coordinatorv1.CutoverRequest{Port: 4889, TimeoutMillis: 500}, func() { l.fakes["n1"].SetReady(true); l.servers["n3"].Stop() }, codes.FailedPrecondition, []string{"n3: agent at 198.18.0.3:9443 unreachable"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			for _, dry := range []bool{false, true} {
				tc.req.DryRun = dry
				_, _, err := l.cutover(tc.req)
				if status.Code(err) != tc.code {
					t.Fatalf("dry_run=%t: got %v, want code %s", dry, err, tc.code)
				}
				for _, w := range tc.want {
					if !strings.Contains(status.Convert(err).Message(), w) {
						t.Errorf("dry_run=%t: message %q lacks %q", dry, status.Convert(err).Message(), w)
					}
				}
			}
			if tc.code == codes.InvalidArgument {
				_, err := l.client.Plan(context.Background(), tc.req)
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("Plan: %v", err)
				}
			}
		})
	}
	// I3/I6: nothing changed anywhere, no operation recorded.
	l.nobodyGot("Prepare")
	l.nobodyGot("Rollback")
	if ents, _ := os.ReadDir(filepath.Join(l.dir, "operations")); len(ents) != 0 {
		t.Errorf("journal has %d entries after refused requests", len(ents))
	}
}

func TestPlanChangesNothing(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].HoldPort(4889, "pid 7")
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Selector: "rack=b"})
	if err != nil {
		t.Fatal(err)
	}
	if p.CurrentPort != 4789 || len(p.Nodes) != 1 || p.Nodes[0].Node != "n2" || p.Nodes[0].TargetPortFree || len(p.Problems) == 0 {
		t.Errorf("plan %v", p)
	}
	l.nobodyGot("Prepare")
	ag, err := l.client.ListAgents(context.Background(), &coordinatorv1.ListAgentsRequest{})
	if err != nil || len(ag.Agents) != 3 || !ag.Agents[0].Ready || ag.Agents[0].CurrentPort != 4789 || ag.Agents[0].RttNanos <= 0 {
		t.Errorf("agents %v %v", ag, err)
	}
}

func TestSecondCutoverRefused(t *testing.T) {
	l := newLab(t, 2, nil)
	l.fakes["n1"].SetFault("Prepare", fakeagent.Fault{Delay: 400 * time.Millisecond})
	done := make(chan *coordinatorv1.Report, 1)
	go func() {
		rep, _, _ := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "first"})
		done <- rep
	}()
	for !l.fakes["n1"].Called("Prepare") {
		time.Sleep(time.Millisecond)
	}
	_, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4890, OperationId: "second"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "operation first is running") {
		t.Fatalf("second cutover: %v", err)
	}
	if rep := <-done; rep == nil || rep.State != succeeded {
		t.Fatalf("first: %v", rep)
	}
	for _, f := range l.fakes {
		for _, c := range f.CallLog() {
			if strings.Contains(c, "second") {
				t.Errorf("agent got %q", c)
			}
		}
	}
	// The id is now taken.
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4789, AllowTunnelPort: true, OperationId: "first"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("reused id: %v", err)
	}
}

// With probing on, the report's probe figures are read again after
// --probe-settle, so probes in flight at the end of the operation are
// counted; without probing nothing waits.
func TestProbeFiguresReadAfterSettle(t *testing.T) {
	l := newLab(t, 2, nil)
	l.fakes["n1"].SetPeers([]*agentv1.PeerProbeStats{{Peer: "n2", Sent: 10, Received: 10}})
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded {
		t.Fatalf("%v %v", rep, err)
	}
	// Verify's mesh reads come first (at least one).
	if r := l.fakes["n1"].ProbeReads(); r < 3 {
		t.Fatalf("probe reads with probing on: %d, want verify's, then 2 (a read, --probe-settle, a read)", r)
	}
	l2 := newLab(t, 2, nil)
	for _, f := range l2.fakes {
		f.SetProbeAddress("", "probing disabled (--probe=false)")
	}
	if rep, _, err := l2.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1", AllowUnprobed: true}); err != nil || rep.State != succeeded {
		t.Fatalf("%v %v", rep, err)
	}
	if r := l2.fakes["n1"].ProbeReads(); r != 1 {
		t.Fatalf("probe reads without probing: %d, want 1 (no wait)", r)
	}
}

// checkCommitMargin asserts what an atomic report says of its commit
// fan-out: every node's Commit arrived (its agent's clock corrected to
// the coordinator's) after the commit phase began and before the instant,
// and the margin is the instant minus the last arrival.
func checkCommitMargin(t *testing.T, rep *coordinatorv1.Report) {
	t.Helper()
	var commitStart int64
	for _, p := range rep.Phases {
		if p.Phase == "commit" {
			commitStart = p.StartedUnixNano
		}
	}
	var last int64
	for _, n := range rep.Nodes {
		at := n.CommitReceivedUnixNano
		// Clock offsets are measured to within half a round trip: allow
		// 20 ms on a loaded machine.
		if at < commitStart-int64(20*time.Millisecond) || at > rep.CommitUnixNano {
			t.Errorf("%s: Commit arrived at %d, want within the commit phase (from %d) and before the instant %d", n.Node, at, commitStart, rep.CommitUnixNano)
		}
		last = max(last, at)
	}
	if commitStart == 0 || rep.CommitMarginNanos <= 0 || rep.CommitMarginNanos != rep.CommitUnixNano-last {
		t.Errorf("commit margin %s, want the instant minus the last arrival, %s (commit phase from %d)", time.Duration(rep.CommitMarginNanos), time.Duration(rep.CommitUnixNano-last), commitStart)
	}
}

// TestAgentConnectionsStayOpen: an agent's connection stays open between
// operations by default (gRPC's own 30-minute idle timeout would close it,
// and the next operation would dial and handshake every agent inside its
// preflight), and closes after --agent-idle-timeout when one is set.
func TestAgentConnectionsStayOpen(t *testing.T) {
	for _, tc := range []struct {
		idle time.Duration
		want connectivity.State
	}{{0, connectivity.Ready}, {100 * time.Millisecond, connectivity.Idle}} {
		l := newLab(t, 2, nil)
		l.cfg = func(c *Config) { c.AgentIdleTimeout = tc.idle }
		l.crash()
		l.start()
		if _, err := l.client.ListAgents(context.Background(), &coordinatorv1.ListAgentsRequest{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // ten idle timeouts of the short case
		for _, n := range l.inv.NodeNames() {
			if got := l.c.fleet.Agent(n).Conn.GetState(); got != tc.want {
				t.Errorf("--agent-idle-timeout %s: %s's connection is %s a second after the last call, want %s", tc.idle, n, got, tc.want)
			}
		}
	}
}

// TestWarmAgents: WarmAgents opens every agent's connection without a
// call, where the clients are otherwise lazy (idle until the first one).
func TestWarmAgents(t *testing.T) {
	l := newLab(t, 3, nil)
	for _, n := range l.inv.NodeNames() {
		if got := l.c.fleet.Agent(n).Conn.GetState(); got != connectivity.Idle {
			t.Fatalf("%s's connection is %s before any call, want IDLE (a lazy client)", n, got)
		}
	}
	l.c.WarmAgents()
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range l.inv.NodeNames() {
		for l.c.fleet.Agent(n).Conn.GetState() != connectivity.Ready {
			if time.Now().After(deadline) {
				t.Fatalf("%s's connection is %s 5 s after WarmAgents, want READY", n, l.c.fleet.Agent(n).Conn.GetState())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for n, f := range l.fakes {
		if got := f.CallLog(); len(got) != 0 {
			t.Errorf("%s: WarmAgents made calls %v, want none (connections only)", n, got)
		}
	}
}
