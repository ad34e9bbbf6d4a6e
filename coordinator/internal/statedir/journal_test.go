package statedir

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
)

// TestJournalPrune: the file journal keeps the newest Keep finished
// operations and every unfinished one, pruning as operations end.
func TestJournalPrune(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Keep = 3
	if err := j.Save(model.Record{ID: "old-running", Seq: 1, Step: "prepare", Outcome: "pending"}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 200; i++ {
		id := fmt.Sprintf("op-%03d", i)
		if err := j.Save(model.Record{ID: id, Seq: int64(i), Step: "prepare", Outcome: "pending"}); err != nil {
			t.Fatal(err)
		}
		if err := j.Save(model.Record{ID: id, Seq: int64(i), Step: "done", Outcome: "succeeded"}); err != nil {
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
	if err := j.Save(model.Record{ID: "op-201", Seq: 201, Step: "done", Outcome: "succeeded"}); err != nil {
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
		r := model.Record{ID: "op-1", Kind: "cutover", FromPort: 4789, ToPort: 4889, Nodes: []string{"n1", "n2"}, Step: "commit", CommitSent: true,
			Outcome: "pending", Seq: 7, Hooks: []model.HookMark{{Hook: "h", Point: "before-commit", State: "started"}}, Report: json.RawMessage(rep)}
		b, err := encode(r)
		if err != nil {
			t.Fatal(err)
		}
		var got model.Record
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
