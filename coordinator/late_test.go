package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// n2 is away for 1.5 s right after it received Commit. Under the
// rollback policy the others are rolled back at about the instant plus the
// answer deadline (1 s), the report names n2 as late, the metric
// counts it and the agents were sent the budget; under the wait policy
// the operation SUCCEEDED with a warning (coordctl exits 7), never
// silently.
func TestLateCommit(t *testing.T) {
	for _, policy := range []string{LateRollback, LateWait} {
		t.Run(policy, func(t *testing.T) {
			l := newLab(t, 3, nil)
			l.crash()
			l.cfg = func(c *Config) { c.LatePolicy, c.SpreadTarget = policy, Default().SpreadTarget }
			l.start()
			l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Delay: 1500 * time.Millisecond})
			start := time.Now()
			rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(msgs, "\n")
			if !strings.Contains(all, "commit n2: late: no answer") {
				t.Errorf("no live event for the late node:\n%s", all)
			}
			if len(rep.LateNodes) != 1 || rep.LateNodes[0].Node != "n2" || rep.LateBudgetNanos != int64(200*time.Millisecond) || rep.LatePolicy != policy {
				t.Fatalf("report late nodes %v budget %d policy %q", rep.LateNodes, rep.LateBudgetNanos, rep.LatePolicy)
			}
			if got := testutil.ToFloat64(l.c.metrics.LateCommits); got != 1 {
				t.Errorf("late commits metric %v, want 1", got)
			}
			switch policy {
			case LateRollback:
				if rep.State != rolledBack || !strings.Contains(rep.Error, "commit failed on n2: no answer by the commit instant plus the answer deadline") || len(rep.Warnings) != 0 {
					t.Fatalf("state %s (%s) warnings %v, want rolled back for n2 late", rep.State, rep.Error, rep.Warnings)
				}
				// The others' Rollback went out before n2 came back.
				if !strings.Contains(all, "rollback: sending to 3 agent(s)") {
					t.Errorf("no rollback:\n%s", all)
				}
			case LateWait:
				// Two warnings: n2 applied late, and so the nodes woke
				// 1.5 s apart, far above the commit spread target.
				if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || len(rep.Warnings) != 2 || !strings.Contains(rep.Warnings[0], "node n2 applied the commit") ||
					!strings.Contains(rep.Warnings[1], "commit spread 1.4") ||
					!rep.LateNodes[0].Applied || rep.LateNodes[0].LatenessNanos < int64(time.Second) {
					t.Fatalf("state %s warnings %v late %v, want SUCCEEDED with a warning for n2", rep.State, rep.Warnings, rep.LateNodes)
				}
			}
			t.Logf("%s: %s in %s", policy, rep.State, time.Since(start))
		})
	}
}

// n2 applies at the instant but its answer comes
// 600 ms later (an agent that did its work after the flip before
// answering), past the lateness budget (200 ms) and within the answer
// deadline (1 s). Lateness is judged by when a node applied: nobody is
// late, the operation SUCCEEDED, without a warning. When the answer was
// what counted (budget plus a 100 ms allowance), this rolled back.
func TestLateAnswerAppliedOnTime(t *testing.T) {
	l := newLab(t, 3, nil)
	l.crash()
	l.start()
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Delay: 600 * time.Millisecond, After: true})
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || len(rep.LateNodes) != 0 || len(rep.Warnings) != 0 {
		t.Fatalf("state %s (%s), late %v, warnings %v; want SUCCEEDED, nobody late\n%s", rep.State, rep.Error, rep.LateNodes, rep.Warnings, strings.Join(msgs, "\n"))
	}
	if got := testutil.ToFloat64(l.c.metrics.LateCommits); got != 0 {
		t.Errorf("late commits metric %v, want 0", got)
	}
	for _, n := range rep.Nodes {
		if n.Node != "n2" {
			continue
		}
		// The answer did come late: the coordinator saw it arrive.
		if d := time.Duration(n.AnswerReceivedUnixNano - n.AppliedUnixNano); d < 500*time.Millisecond {
			t.Errorf("n2 answered %s after it applied, want the 600 ms delay", d)
		}
	}
}

// The other way: an agent that applies past the
// budget (its clock put it there: it was sent an instant 400 ms earlier
// than the others, as a wrong offset would) is late by its own report
// although its answer is prompt, and everyone is rolled back.
func TestLateApplyPromptAnswer(t *testing.T) {
	l := newLab(t, 3, nil)
	l.crash()
	l.start()
	// The fake applies at once when the instant has passed; report an
	// applied time 400 ms past the instant instead.
	l.fakes["n2"].SetAppliedShift(400 * time.Millisecond)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack || !strings.Contains(rep.Error, "commit failed on n2: applied ") || !strings.Contains(rep.Error, "past the lateness budget 200ms") {
		t.Fatalf("state %s (%s), want rolled back for n2 applying late\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if len(rep.LateNodes) != 1 || rep.LateNodes[0].Node != "n2" || !rep.LateNodes[0].Applied {
		t.Fatalf("late nodes %v, want n2 (applied)", rep.LateNodes)
	}
}

// n2 applies 120 ms after the others, within the
// lateness budget: the change SUCCEEDED, but the nodes did not flip
// together, and the report says so (a warning: coordctl exits 7) when the
// commit spread exceeds the target; without a target it does not.
func TestSpreadWarning(t *testing.T) {
	for _, target := range []time.Duration{50 * time.Millisecond, 0} {
		t.Run(target.String(), func(t *testing.T) {
			l := newLab(t, 3, nil)
			l.crash()
			l.cfg = func(c *Config) { c.SpreadTarget = target }
			l.start()
			l.fakes["n2"].SetAppliedShift(120 * time.Millisecond)
			rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || len(rep.LateNodes) != 0 {
				t.Fatalf("state %s (%s), late %v; want SUCCEEDED, nobody late", rep.State, rep.Error, rep.LateNodes)
			}
			if rep.CommitSpreadNanos < int64(100*time.Millisecond) {
				t.Fatalf("commit spread %s, want n2's 120 ms", time.Duration(rep.CommitSpreadNanos))
			}
			want := 1
			if target == 0 {
				want = 0
			}
			if len(rep.Warnings) != want || (want == 1 && !strings.Contains(rep.Warnings[0], "above the target 50ms")) {
				t.Fatalf("warnings %q, want %d naming the target", rep.Warnings, want)
			}
		})
	}
}

// n2 reached the instant past the budget and applied nothing: its agent
// answers ABORTED with its lateness (agentv1.LateStatus), promptly, before
// the answer deadline. It is a late node, named in the report with how late
// it was and counted, not only a failed call; everyone is rolled back.
func TestLateRefusalNamesTheNode(t *testing.T) {
	l := newLab(t, 3, nil)
	l.crash()
	l.start()
	l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Err: agentv1.LateStatus("operation op1: commit late by 912ms (lateness budget 200ms): not applied (still on port 4789)", 912*time.Millisecond)})
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s (%s), want rolled back\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if len(rep.LateNodes) != 1 || rep.LateNodes[0].Node != "n2" || rep.LateNodes[0].Applied || rep.LateNodes[0].LatenessNanos != int64(912*time.Millisecond) {
		t.Fatalf("late nodes %v, want n2 late by 912ms, not applied", rep.LateNodes)
	}
	if got := testutil.ToFloat64(l.c.metrics.LateCommits); got != 1 {
		t.Errorf("late commits metric %v, want 1", got)
	}
	if all := strings.Join(msgs, "\n"); !strings.Contains(all, "commit n2: late: reached the commit instant 912ms after it and applied nothing") {
		t.Errorf("no live event naming n2 late:\n%s", all)
	}
}
