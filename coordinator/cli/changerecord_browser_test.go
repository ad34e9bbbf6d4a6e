package cli

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"
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
			// The check bites: the page's text, before its script ran,
			// has no timeline rows nor heatmap cells, and fails it.
			if rec := (&recordingTB{TB: t}); func() bool { browser.CheckChangeRecord(rec, b.String(), rep); return !rec.failed }() {
				t.Fatalf("CheckChangeRecord passed on the page's text: it would not show the script drew the page")
			}
			dom := browser.DumpDOM(t, bin, browser.FileURL(t, page))
			browser.CheckChangeRecord(t, dom, rep)

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

// TestChangeRecordInBrowserStates: a running (partial), an aborted and a
// rolled-back operation's records draw in the browser too: every node on
// the timeline, every pair in the heatmap, the commit line only when a
// commit was sent.
func TestChangeRecordInBrowserStates(t *testing.T) {
	bin := browser.Require(t)
	for _, st := range []coordinatorv1.OperationState{
		coordinatorv1.OperationState_OPERATION_STATE_RUNNING,
		coordinatorv1.OperationState_OPERATION_STATE_ABORTED,
		coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK,
	} {
		t.Run(stateName(st), func(t *testing.T) {
			rep := sampleRecord(4, st)
			for _, n := range rep.Nodes {
				n.FinalizedUnixNano, n.ConfirmedUnixNano = 0, 0
				switch st {
				case coordinatorv1.OperationState_OPERATION_STATE_RUNNING:
					rep.EndedUnixNano = 0
				case coordinatorv1.OperationState_OPERATION_STATE_ABORTED:
					n.AppliedUnixNano, n.RevertedUnixNano, n.RevertedBy, n.Port = 0, n.PreparedUnixNano+200_000_000, "abort", 4789
					rep.CommitUnixNano, rep.Disruption = 0, nil
				default:
					n.RevertedUnixNano, n.RevertedBy, n.Port = rep.CommitUnixNano+700_000_000, "rollback", 4789
				}
			}
			page := filepath.Join(t.TempDir(), "change.html")
			var b bytes.Buffer
			if err := writeRecordHTML(&b, rep, time.Unix(0, t0+3e9)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			dom := browser.DumpDOM(t, bin, browser.FileURL(t, page))
			browser.CheckChangeRecord(t, dom, rep)
			if say := strings.Contains(dom, `id="no-probe-figures"`); say != (len(rep.Disruption) == 0) {
				t.Errorf("no-probe-figures note shown=%v with %d pairs", say, len(rep.Disruption))
			}
			marks := len(browser.Elements(dom, "circle", "mk-reverted"))
			if want := map[bool]int{true: 0, false: 4}[st == coordinatorv1.OperationState_OPERATION_STATE_RUNNING]; marks != want {
				t.Errorf("%d reverted markers drawn, want %d", marks, want)
			}
		})
	}
}

// recordingTB notes failures instead of failing the test.
type recordingTB struct {
	testing.TB
	failed bool
}

func (r *recordingTB) Errorf(string, ...any) { r.failed = true }
func (r *recordingTB) Fatalf(string, ...any) { r.failed = true }
func (r *recordingTB) Helper()               {}
