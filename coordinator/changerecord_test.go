package coordinator

import (
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestChangeRecordTimeline: a report carries what the change record shows:
// who asked, the request, the preflight plan, the commit instant, the
// events, and per node its steps in order on the coordinator's clock.
func TestChangeRecordTimeline(t *testing.T) {
	l := newLab(t, 3, nil)
	req := &coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"}
	rep, msgs, err := l.cutover(req)
	if err != nil || rep.State != succeeded {
		t.Fatalf("state %s %v\n%s", rep.GetState(), err, strings.Join(msgs, "\n"))
	}
	if !strings.Contains(rep.RequestedBy, "unauthenticated") || !strings.Contains(rep.RequestedBy, "from ") {
		t.Errorf("requested_by %q: want the (plaintext) caller and its address", rep.RequestedBy)
	}
	if !proto.Equal(rep.Request, req) {
		t.Errorf("request %v, want %v", rep.Request, req)
	}
	if len(rep.Plan.GetNodes()) != 3 || rep.Plan.GetTargetPort() != 4889 || len(rep.Plan.GetProblems()) != 0 {
		t.Errorf("plan %v", rep.Plan)
	}
	if rep.CommitUnixNano == 0 || len(rep.Events) == 0 {
		t.Errorf("commit instant %d, %d events", rep.CommitUnixNano, len(rep.Events))
	}
	for _, e := range rep.Events {
		if e.Report != nil {
			t.Errorf("event %q carries a report", e.Message)
		}
	}
	for _, n := range rep.Nodes {
		steps := []int64{rep.StartedUnixNano, n.PreparedUnixNano, n.ConfirmedUnixNano, n.FinalizedUnixNano, rep.EndedUnixNano}
		for i := 1; i < len(steps); i++ {
			if steps[i] == 0 || steps[i] < steps[i-1] {
				t.Errorf("%s: steps out of order or missing (start, prepared, confirmed, finalized, end): %v", n.Node, steps)
				break
			}
		}
		if n.PreparedUnixNano > rep.CommitUnixNano || n.AppliedUnixNano < n.PreparedUnixNano || n.RevertedUnixNano != 0 {
			t.Errorf("%s: prepared %d, commit %d, applied %d, reverted %d", n.Node, n.PreparedUnixNano, rep.CommitUnixNano, n.AppliedUnixNano, n.RevertedUnixNano)
		}
		if n.Backend == "" || n.Port != 4889 {
			t.Errorf("%s: read back backend %q port %d", n.Node, n.Backend, n.Port)
		}
	}
}

// TestChangeRecordReverted: an aborted operation marks undone only the
// nodes that had prepared; a rolled-back one every node, after it applied.
func TestChangeRecordReverted(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFault("Prepare", fakeagent.Fault{Err: status.Error(codes.Internal, "iptables: permission denied")})
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != aborted {
		t.Fatalf("state %s %v", rep.GetState(), err)
	}
	for _, n := range rep.Nodes {
		want := n.Node != "n2"
		if got := n.RevertedUnixNano != 0; got != want || (want && (n.RevertedBy != "abort" || n.RevertedUnixNano < n.PreparedUnixNano)) {
			t.Errorf("%s: reverted %d by %q after prepared %d; want reverted=%v by abort", n.Node, n.RevertedUnixNano, n.RevertedBy, n.PreparedUnixNano, want)
		}
	}
	if rep.CommitUnixNano != 0 {
		t.Errorf("aborted operation has a commit instant %d", rep.CommitUnixNano)
	}

	l2 := newLab(t, 3, nil)
	l2.fakes["n2"].SetFault("Commit", fakeagent.Fault{After: true, Err: status.Error(codes.Unavailable, "connection reset")})
	rep, _, err = l2.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op2"})
	if err != nil || rep.State != rolledBack {
		t.Fatalf("state %s %v", rep.GetState(), err)
	}
	for _, n := range rep.Nodes {
		if n.RevertedUnixNano == 0 || n.RevertedBy != "rollback" || n.RevertedUnixNano < rep.CommitUnixNano || n.ConfirmedUnixNano != 0 {
			t.Errorf("%s: reverted %d by %q, commit %d, confirmed %d", n.Node, n.RevertedUnixNano, n.RevertedBy, rep.CommitUnixNano, n.ConfirmedUnixNano)
		}
	}
}

// TestProgressEvents: a cutover's stream says each step's nodes and every
// node's answer, preflight included (live, before the run starts), and a
// refused cutover still streams its preflight progress before the error.
func TestProgressEvents(t *testing.T) {
	l := newLab(t, 3, nil)
	_, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(msgs, "\n")
	for _, want := range []string{"preflight: preflight: asking 3 agent(s)", "preflight n2: preflight: ok", "prepare n3: prepare: ok", "commit n1: commit: ok", "finalize n2: finalize: ok"} {
		if !strings.Contains(got, want) {
			t.Errorf("stream lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "preflight n1: preflight: ok") > strings.Index(got, "preflight passed") {
		t.Errorf("preflight progress after the preflight result:\n%s", got)
	}

	l.fakes["n2"].HoldPort(4890, "dnsmasq")
	_, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4890, OperationId: "op2"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(strings.Join(msgs, "\n"), "preflight n3: preflight: ok") {
		t.Errorf("refused cutover: %v\n%s", err, strings.Join(msgs, "\n"))
	}
}
