package coordinator

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
)

// recordingJournal keeps every record written.
type recordingJournal struct {
	mu    sync.Mutex
	saves []Record
}

func (j *recordingJournal) Save(r Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.saves = append(j.saves, r)
	return nil
}
func (j *recordingJournal) Load() ([]Record, error) { return nil, nil }
func (j *recordingJournal) last() Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.saves[len(j.saves)-1]
}

// TestSaveWritesStepBeforeReport: a step's record (commit_sent: what a
// restarted coordinator decides from) is written before save returns,
// whatever the report's encoding is doing; the record a run ends with
// carries the newest report.
func TestSaveWritesStepBeforeReport(t *testing.T) {
	j := &recordingJournal{}
	c, err := New(Config{StateDir: t.TempDir(), Insecure: true}, Inventory{}, WithJournal(j))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	op := opstate.New("op-1", "cutover", 4789, 4889, []string{"n1"}, time.Second, time.Second, 1)
	op.EncodeMu.Lock() // an encoding in progress
	op.Mu.Lock()
	op.Rec.Step, op.Rec.CommitSent = "commit", true
	op.Report.Error = "marker"
	op.Mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- c.save(op) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		op.EncodeMu.Unlock()
		t.Fatal("save waited for the report's encoding before writing the step")
	}
	if r := j.last(); r.Step != "commit" || !r.CommitSent {
		t.Fatalf("written at save: step %q commit_sent %v, want commit, true", r.Step, r.CommitSent)
	}
	op.EncodeMu.Unlock()
	op.Mu.Lock()
	op.Rec.Step, op.Rec.Outcome = "done", "succeeded"
	op.Report.Error = "final marker"
	op.Mu.Unlock()
	if err := c.saveFinal(op); err != nil {
		t.Fatal(err)
	}
	r := j.last()
	if r.Step != "done" || !bytes.Contains(r.Report, []byte("final marker")) {
		t.Fatalf("final record: step %q, report %s; want done and the newest report", r.Step, r.Report)
	}
}
