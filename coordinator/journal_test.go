package coordinator

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
