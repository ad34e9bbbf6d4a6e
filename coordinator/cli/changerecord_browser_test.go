package cli

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/browser"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// TestChangeRecordInBrowser opens change records of 4 and 200 nodes in a
// real headless Chromium: the DOM after the page's script ran has one
// timeline row per node and one heatmap cell per probed pair (drawn by the
// script, not in the file's text), and the screenshot is a PNG of the
// window's size with the heatmap's and the commit line's colours in it.
func TestChangeRecordInBrowser(t *testing.T) {
	bin := browser.Require(t)
	for _, n := range []int{4, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rep := sampleRecord(n, coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
			page := filepath.Join(t.TempDir(), "change.html")
			var b bytes.Buffer
			if err := writeRecordHTML(&b, rep, time.Unix(0, t0+5e9)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := len(browser.Elements(b.String(), "rect", "hm-cell")); got != 0 {
				t.Fatalf("the file itself holds %d heatmap cells: the test would not show the script drew them", got)
			}
			dom := browser.DumpDOM(t, bin, browser.FileURL(t, page))
			CheckRecordDOM(t, dom, rep)

			png := browser.Screenshot(t, bin, browser.FileURL(t, page), 1280, 3200)
			for _, c := range []struct {
				what string
				c    color.RGBA
			}{{"heatmap green (0 lost)", color.RGBA{0x2e, 0x7d, 0x32, 0}}, {"commit line red", color.RGBA{0xb3, 0x26, 0x1e, 0}}} {
				if k, err := browser.CountColor(png, c.c, 12); err != nil || k < 20 {
					t.Errorf("screenshot: %d pixels of %s (%v); the page did not draw", k, c.what, err)
				}
			}
		})
	}
}

// CheckRecordDOM asserts that a change record's DOM, as the browser built
// it, has every node of rep on the timeline and every pair of its
// disruption in the heatmap, and that the script finished.
func CheckRecordDOM(t *testing.T, dom string, rep *coordinatorv1.Report) {
	t.Helper()
	rows := browser.Elements(dom, "g", "tl-node")
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
	cells := browser.Elements(dom, "rect", "hm-cell")
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
	if len(browser.Elements(dom, "line", "tl-commit")) != 0 != (rep.GetCommitUnixNano() != 0) {
		t.Errorf("commit line drawn=%v, commit instant %d", len(browser.Elements(dom, "line", "tl-commit")) != 0, rep.GetCommitUnixNano())
	}
	if len(browser.Elements(dom, "body", "rendered")) != 1 {
		t.Errorf("the page's script did not finish (body not marked rendered)")
	}
}
