package coordinator

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
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
	op.AddWarning("marker")
	op.Mu.Lock()
	op.Rec.Step, op.Rec.CommitSent = "commit", true
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
	op.AddWarning("final marker")
	op.Mu.Lock()
	op.Rec.Step, op.Rec.Outcome = "done", "succeeded"
	op.Mu.Unlock()
	if err := c.saveFinal(op); err != nil {
		t.Fatal(err)
	}
	r := j.last()
	if r.Step != "done" || !bytes.Contains(r.Report, []byte("final marker")) {
		t.Fatalf("final record: step %q, report %s; want done and the newest report", r.Step, r.Report)
	}
}

// refusingJournal keeps records in memory and refuses the writes refuse
// picks, as a full or read-only disk would.
type refusingJournal struct {
	recordingJournal
	refuse func(Record) bool
}

func (j *refusingJournal) Save(r Record) error {
	if j.refuse(r) {
		return errors.New("write op1.json: no space left on device")
	}
	return j.recordingJournal.Save(r)
}

// TestCommitNotSentUnjournaled: a Commit the journal cannot record as sent
// is not sent. After a crash the record would claim nobody flipped while
// agents had; instead nothing flips, the operation aborts, and the report
// says why. The Abort's own journal write is refused too: an undo never
// waits on the disk.
func TestCommitNotSentUnjournaled(t *testing.T) {
	l := newLab(t, 3, nil)
	l.c.Close()
	j := &refusingJournal{refuse: func(r Record) bool { return r.CommitSent || r.Step == "abort" }}
	l.extra = []Option{WithJournal(j)}
	l.start()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	l.nobodyGot("Commit")
	if rep.State != aborted || !strings.Contains(rep.Error, "the journal could not record commit#1: write op1.json: no space left on device; the commit was not sent") ||
		!strings.Contains(rep.Error, "the journal could not record abort#1") {
		t.Fatalf("state %s, error %q\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	l.everyoneGot("Rollback")
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=ABORTED
		n2 port=4789 op=op1 phase=ABORTED
		n3 port=4789 op=op1 phase=ABORTED`)
	for _, r := range j.saves {
		if r.CommitSent {
			t.Errorf("a record claims the commit was sent: %+v", r)
		}
	}
}
