package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPrunable(t *testing.T) {
	r := func(id string, seq int64, outcome string) Record { return Record{ID: id, Seq: seq, Outcome: outcome} }
	// "held" (a staged subset waiting for its next run) is never pruned,
	// however old: it is the operation the next cutover continues.
	recs := []Record{r("d", 4, "succeeded"), r("a", 1, "failed"), r("run", 2, "pending"), r("b", 3, "rolled-back"), r("new", 5, ""), r("h", 0, "held")}
	for _, tc := range []struct {
		keep int
		want string
	}{{0, "a,b,d"}, {1, "a,b"}, {2, "a"}, {3, ""}, {10, ""}} {
		var got []string
		for _, x := range Prunable(recs, tc.keep) {
			got = append(got, x.ID)
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("keep %d: pruned %v, want %s (never the unfinished or held ones)", tc.keep, got, tc.want)
		}
	}
}

// TestJournalPrune: the file journal keeps the newest Keep finished
// operations and every unfinished one, pruning as operations end.
func TestJournalPrune(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Keep = 3
	if err := j.Save(Record{ID: "old-running", Seq: 1, Step: "prepare", Outcome: "pending"}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 200; i++ {
		id := fmt.Sprintf("op-%03d", i)
		if err := j.Save(Record{ID: id, Seq: int64(i), Step: "prepare", Outcome: "pending"}); err != nil {
			t.Fatal(err)
		}
		if err := j.Save(Record{ID: id, Seq: int64(i), Step: "done", Outcome: "succeeded"}); err != nil {
			t.Fatal(err)
		}
	}
	names, err := filepath.Glob(filepath.Join(dir, "operations", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range names {
		got = append(got, filepath.Base(n))
	}
	slices.Sort(got)
	if want := "old-running.json,op-198.json,op-199.json,op-200.json"; strings.Join(got, ",") != want {
		t.Errorf("operations/ holds %v, want %s", got, want)
	}
	// Keep 0 keeps everything.
	j.Keep = 0
	if err := j.Save(Record{ID: "op-201", Seq: 201, Step: "done", Outcome: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	if recs, err := j.Load(); err != nil || len(recs) != 5 {
		t.Errorf("keep 0: %d records, err %v", len(recs), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "operations", "op-201.json")); err != nil {
		t.Error(err)
	}
}

// TestRecordEncode: the journal's encoding (the report spliced in as
// protojson wrote it) reads back as the record, and a record without a
// report has no "report" key.
func TestRecordEncode(t *testing.T) {
	for _, rep := range []string{"", `{"operationId":"op-1","nodes":[{"node":"n1","error":"a \"quoted\" }"}]}`} {
		r := Record{ID: "op-1", Kind: "cutover", FromPort: 4789, ToPort: 4889, Nodes: []string{"n1", "n2"}, Step: "commit", CommitSent: true,
			Outcome: "pending", Seq: 7, Hooks: []HookMark{{Hook: "h", Point: "before-commit", State: HookStarted}}, Report: json.RawMessage(rep)}
		b, err := r.encode()
		if err != nil {
			t.Fatal(err)
		}
		var got Record
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("report %q: %v\n%s", rep, err, b)
		}
		if rep == "" {
			r.Report = nil
			if bytes.Contains(b, []byte(`"report"`)) {
				t.Errorf("no report, yet %s", b)
			}
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("read back %+v, want %+v\n%s", got, r, b)
		}
	}
}

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
	op := newOperation("op-1", "cutover", 4789, 4889, []string{"n1"}, time.Second, time.Second, 1)
	op.encodeMu.Lock() // an encoding in progress
	op.mu.Lock()
	op.rec.Step, op.rec.CommitSent = "commit", true
	op.report.Error = "marker"
	op.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- c.save(op) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		op.encodeMu.Unlock()
		t.Fatal("save waited for the report's encoding before writing the step")
	}
	if r := j.last(); r.Step != "commit" || !r.CommitSent {
		t.Fatalf("written at save: step %q commit_sent %v, want commit, true", r.Step, r.CommitSent)
	}
	op.encodeMu.Unlock()
	op.mu.Lock()
	op.rec.Step, op.rec.Outcome = "done", "succeeded"
	op.report.Error = "final marker"
	op.mu.Unlock()
	if err := c.saveFinal(op); err != nil {
		t.Fatal(err)
	}
	r := j.last()
	if r.Step != "done" || !bytes.Contains(r.Report, []byte("final marker")) {
		t.Fatalf("final record: step %q, report %s; want done and the newest report", r.Step, r.Report)
	}
}
