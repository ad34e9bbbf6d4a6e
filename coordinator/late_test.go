package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cutover-dev/cutover/coordinator/internal/fakeagent"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// Issue 12: n2 is away for 1.5 s right after it received Commit. Under the
// rollback policy the others are rolled back at about the instant plus the
// budget and the allowance, the report names n2 as late, the metric
// counts it and the agents were sent the budget; under the wait policy
// the operation SUCCEEDED with a warning (coordctl exits 7), never
// silently.
func TestLateCommit(t *testing.T) {
	for _, policy := range []string{LateRollback, LateWait} {
		t.Run(policy, func(t *testing.T) {
			l := newLab(t, 3, nil)
			l.crash()
			l.cfg = func(c *Config) { c.LatePolicy = policy }
			l.start()
			l.fakes["n2"].SetFault("Commit", fakeagent.Fault{Delay: 1500 * time.Millisecond})
			start := time.Now()
			rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(msgs, "\n")
			if !strings.Contains(all, "commit n2: late: not applied") {
				t.Errorf("no live event for the late node:\n%s", all)
			}
			if len(rep.LateNodes) != 1 || rep.LateNodes[0].Node != "n2" || rep.LateBudgetNanos != int64(200*time.Millisecond) || rep.LatePolicy != policy {
				t.Fatalf("report late nodes %v budget %d policy %q", rep.LateNodes, rep.LateBudgetNanos, rep.LatePolicy)
			}
			if got := testutil.ToFloat64(l.c.metrics.lateCommits); got != 1 {
				t.Errorf("late commits metric %v, want 1", got)
			}
			switch policy {
			case LateRollback:
				if rep.State != rolledBack || !strings.Contains(rep.Error, "commit failed on n2: not applied by the commit instant plus the lateness budget") || len(rep.Warnings) != 0 {
					t.Fatalf("state %s (%s) warnings %v, want rolled back for n2 late", rep.State, rep.Error, rep.Warnings)
				}
				// The others' Rollback went out before n2 came back.
				if !strings.Contains(all, "rollback: sending to 3 agent(s)") {
					t.Errorf("no rollback:\n%s", all)
				}
			case LateWait:
				if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "node n2 applied the commit") ||
					!rep.LateNodes[0].Applied || rep.LateNodes[0].LatenessNanos < int64(time.Second) {
					t.Fatalf("state %s warnings %v late %v, want SUCCEEDED with a warning for n2", rep.State, rep.Warnings, rep.LateNodes)
				}
			}
			t.Logf("%s: %s in %s", policy, rep.State, time.Since(start))
		})
	}
}
