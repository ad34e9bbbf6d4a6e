package model

import (
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
