//go:build cutover_faultinject

package coordinator

import (
	"testing"

	"github.com/cutover-dev/cutover/coordinator/internal/runner"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// TestCommitNotSentUnjournaledBites: with the runner dropping a failed
// journal write (the old `_ = c.save(op)`), the Commit goes out though
// the journal does not know it: what TestCommitNotSentUnjournaled
// asserts (nobody got Commit) breaks.
func TestCommitNotSentUnjournaledBites(t *testing.T) {
	runner.IgnoreJournalErrors(true)
	t.Cleanup(func() { runner.IgnoreJournalErrors(false) })
	l := newLab(t, 3, nil)
	l.c.Close()
	l.extra = []Option{WithJournal(&refusingJournal{refuse: func(r Record) bool { return r.CommitSent }})}
	l.start()
	if _, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"}); err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, f := range l.fakes {
		if f.Called("Commit") {
			got++
		}
	}
	if got == 0 {
		t.Fatal("no agent got Commit with the journal's failure ignored: TestCommitNotSentUnjournaled would not catch a runner that ignores it")
	}
	t.Logf("mutation caught: %d agent(s) got a Commit the journal never recorded", got)
}
