package cli

import (
	"errors"
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
