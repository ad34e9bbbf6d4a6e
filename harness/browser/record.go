package browser

import (
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// CheckChangeRecord asserts that a change record's DOM, as the browser built
// it, has every node of rep on the timeline and every pair of its
// disruption in the heatmap, and that the script finished.
func CheckChangeRecord(t testing.TB, dom string, rep *coordinatorv1.Report) {
	t.Helper()
	rows := Elements(dom, "g", "tl-node")
	if len(rows) != len(rep.GetNodes()) {
		t.Errorf("timeline rows: %d, want %d (one per node)", len(rows), len(rep.GetNodes()))
	}
	got := map[string]bool{}
	for _, r := range rows {
		got[r["data-node"]] = true
	}
	for _, n := range rep.GetNodes() {
		if !got[n.GetNode()] {
			t.Errorf("node %s missing from the timeline", n.GetNode())
		}
	}
	cells := Elements(dom, "rect", "hm-cell")
	if len(cells) != len(rep.GetDisruption()) {
		t.Errorf("heatmap cells: %d, want %d (one per probed pair)", len(cells), len(rep.GetDisruption()))
	}
	pairs := map[[2]string]bool{}
	for _, c := range cells {
		pairs[[2]string{c["data-from"], c["data-to"]}] = true
	}
	for _, d := range rep.GetDisruption() {
		if !pairs[[2]string{d.GetFrom(), d.GetTo()}] {
			t.Errorf("pair %s → %s missing from the heatmap", d.GetFrom(), d.GetTo())
		}
	}
	if len(Elements(dom, "line", "tl-commit")) != 0 != (rep.GetCommitUnixNano() != 0) {
		t.Errorf("commit line drawn=%v, commit instant %d", len(Elements(dom, "line", "tl-commit")) != 0, rep.GetCommitUnixNano())
	}
	if len(Elements(dom, "body", "rendered")) != 1 {
		t.Errorf("the page's script did not finish (body not marked rendered)")
	}
}
