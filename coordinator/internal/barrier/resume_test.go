package barrier

import "testing"

// TestChooseResume: the restart policy, every combination.
func TestChooseResume(t *testing.T) {
	for _, tc := range []struct {
		commitSent   bool
		step         Step
		allCommitted bool
		want         Resume
		asks         bool
	}{
		{false, Prepare, false, ResumeAbort, false},
		{false, Prepare, true, ResumeAbort, false},
		{false, Abort, false, ResumeAbort, false},
		{true, Commit, true, ResumeVerify, true},
		{true, Commit, false, ResumeRollback, true},
		{true, Verify, true, ResumeVerify, true},
		{true, Confirm, false, ResumeRollback, true},
		{true, Rollback, true, ResumeRollback, false},
		{true, Abort, true, ResumeRollback, false},
	} {
		if got := ChooseResume(tc.commitSent, tc.step, tc.allCommitted); got != tc.want {
			t.Errorf("ChooseResume(commitSent=%t, %s, allCommitted=%t) = %d, want %d", tc.commitSent, tc.step, tc.allCommitted, got, tc.want)
		}
		if got := NeedsAgents(tc.commitSent, tc.step); got != tc.asks {
			t.Errorf("NeedsAgents(%t, %s) = %t, want %t", tc.commitSent, tc.step, got, tc.asks)
		}
	}
}
