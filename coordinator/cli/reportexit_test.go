package cli

import (
	"errors"
	"strings"
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// A rollback of a succeeded operation is a reverse cutover: it worked when
// it SUCCEEDED, and it did NOT when it rolled back (the nodes stayed put).
func TestReportExitForReverseCutover(t *testing.T) {
	for _, tc := range []struct {
		state coordinatorv1.OperationState
		kind  string
		o     outcome
		want  int
	}{
		{coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED, "rollback", outcomeRollback, ExitOK},
		{coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK, "rollback", outcomeRollback, ExitFailed},
		{coordinatorv1.OperationState_OPERATION_STATE_ABORTED, "rollback", outcomeRollback, ExitFailed},
		{coordinatorv1.OperationState_OPERATION_STATE_FAILED, "rollback", outcomeRollback, ExitOpFailed},
		{coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK, "cutover", outcomeRollback, ExitOK},
		{coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED, "cutover", outcomeRollback, ExitFailed},
	} {
		err := reportExit(&coordinatorv1.Report{OperationId: "op2", State: tc.state, Kind: tc.kind, RevertsOperationId: "op1", FromPort: 4889}, tc.o)
		got := ExitOK
		var ee *ExitError
		if errors.As(err, &ee) {
			got = ee.Code
		} else if err != nil {
			t.Fatalf("%v %s: non-exit error %v", tc.state, tc.kind, err)
		}
		if got != tc.want {
			t.Errorf("%v kind %s: exit %d (%v), want %d", tc.state, tc.kind, got, err, tc.want)
		}
	}
}

// A SUCCEEDED report with warnings (a late node applied under
// --commit-late-policy=wait) is not a clean success: exit 7, and the
// report shows the late nodes and the warnings.
func TestReportExitWithWarnings(t *testing.T) {
	S := coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED
	rep := &coordinatorv1.Report{OperationId: "op1", State: S, Kind: "cutover", FromPort: 4789, ToPort: 4889,
		LateBudgetNanos: 200e6, LatePolicy: "wait",
		LateNodes: []*coordinatorv1.LateNode{{Node: "n3", LatenessNanos: 5_943_681_000, Applied: true}},
		Warnings:  []string{"node n3 applied the commit 5.944s after the instant (lateness budget 200ms): the overlay was split meanwhile"}}
	err := reportExit(rep, outcomeCutover)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != ExitWarnings || ExitWarnings != 7 || !strings.Contains(err.Error(), "SUCCEEDED with 1 warning(s): node n3") {
		t.Fatalf("reportExit = %v, want exit 7 naming the warning", err)
	}
	rep.Warnings = nil
	if err := reportExit(rep, outcomeCutover); err != nil {
		t.Fatalf("no warnings: %v, want a clean success", err)
	}
	rep.Warnings = []string{"w"}
	if err := reportExit(rep, outcomeRollback); !errors.As(err, &ee) || ee.Code != ExitFailed {
		t.Fatalf("rollback of a succeeded operation with warnings: %v, want exit 1", err)
	}
	var b strings.Builder
	renderReport(&b, &coordinatorv1.Report{State: S, LateBudgetNanos: 200e6, LatePolicy: "rollback",
		LateNodes: []*coordinatorv1.LateNode{{Node: "n3", LatenessNanos: 300e6}}, Warnings: []string{"split for 6s"}})
	for _, w := range []string{"late: n3 did not apply, 300.000 ms after the commit instant (budget 200.000 ms, policy rollback)", "warnings:\n  split for 6s"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q:\n%s", w, b.String())
		}
	}
}

// A held staged subset did what was asked: exit 0; rolling it back is not
// what "rollback" ended with when the report says HELD.
func TestReportExitHeld(t *testing.T) {
	rep := &coordinatorv1.Report{OperationId: "op1", State: coordinatorv1.OperationState_OPERATION_STATE_HELD, Kind: "cutover", FromPort: 4789, ToPort: 4889, Strategy: "staged"}
	if err := reportExit(rep, outcomeCutover); err != nil {
		t.Fatalf("held: %v, want exit 0", err)
	}
	var ee *ExitError
	if err := reportExit(rep, outcomeRollback); !errors.As(err, &ee) || ee.Code != ExitFailed || !strings.Contains(err.Error(), "HELD") {
		t.Fatalf("rollback answered HELD: %v, want exit 1 naming HELD", err)
	}
}
