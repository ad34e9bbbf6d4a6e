package lab_test

import (
	"context"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/browser"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// TestChangeRecordOfLabCutover: a real cutover on a 4-node kernel-VXLAN
// lab (real agents and coordinator, probes on), then `coordctl report -o
// html` as a user runs it, opened in headless Chromium: every node is on
// the page's timeline and every probed pair in its heatmap, as the
// browser built them, and the screenshot is a page of the window's size.
// The JSON record of the same operation has every node's steps in order.
func TestChangeRecordOfLabCutover(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "bridge", "iptables", "iptables-restore", "iptables-save", "go")
	chromium := browser.Require(t)
	bin := labtest.Binaries(t)
	cfg := newConfig(t, lab.BackendKernelVXLAN, 4)
	cfg.StartProcesses = true
	cfg.AgentBin = filepath.Join(bin, "agent")
	cfg.CoordinatorBin = filepath.Join(bin, "coordinator")
	cfg.ProbeInterval = e2eInterval
	e := &e2eLab{t: t, l: up(t, cfg), cutoverLab: filepath.Join(bin, "cutover-lab")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.warmProbes()

	done := e.report(ctx, 0, "cutover", "--port", "4889")
	if done.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("cutover: %s: %s", done.GetState(), done.GetError())
	}
	rep := e.report(ctx, 0, "ctl", "report", done.GetOperationId())
	if rep.GetOperationId() != done.GetOperationId() || len(rep.GetNodes()) != 4 || len(rep.GetDisruption()) != 12 {
		t.Fatalf("report %s: %d nodes, %d pairs; want %s, 4 nodes, 12 pairs", rep.GetOperationId(), len(rep.GetNodes()), len(rep.GetDisruption()), done.GetOperationId())
	}
	if rep.GetRequestedBy() == "" || len(rep.GetPlan().GetNodes()) != 4 || rep.GetRequest().GetPort() != 4889 || rep.GetCommitUnixNano() == 0 || len(rep.GetEvents()) == 0 {
		t.Errorf("record incomplete: requested_by %q, plan %d nodes, request %v, commit %d, %d events",
			rep.GetRequestedBy(), len(rep.GetPlan().GetNodes()), rep.GetRequest(), rep.GetCommitUnixNano(), len(rep.GetEvents()))
	}
	for _, n := range rep.GetNodes() {
		steps := []int64{rep.GetStartedUnixNano(), n.GetPreparedUnixNano(), rep.GetCommitUnixNano(), n.GetConfirmedUnixNano(), n.GetFinalizedUnixNano(), rep.GetEndedUnixNano()}
		for i := 1; i < len(steps); i++ {
			if steps[i] == 0 || steps[i] < steps[i-1] {
				t.Errorf("%s: steps (start, prepared, commit, confirmed, finalized, end) missing or out of order: %v", n.GetNode(), steps)
				break
			}
		}
		if n.GetBackend() != "kernel-vxlan" || n.GetPort() != 4889 || n.GetAppliedUnixNano() == 0 {
			t.Errorf("%s: read back %s port %d, applied %d", n.GetNode(), n.GetBackend(), n.GetPort(), n.GetAppliedUnixNano())
		}
	}

	page, code := e.run(ctx, "ctl", "report", done.GetOperationId(), "-o", "html")
	if code != 0 || !strings.HasPrefix(page, "<!DOCTYPE html>") {
		t.Fatalf("report -o html: exit %d:\n%.300s", code, page)
	}
	file := filepath.Join(t.TempDir(), "change.html")
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := browser.DumpDOM(t, chromium, browser.FileURL(t, file))
	browser.CheckChangeRecord(t, dom, rep)
	png := browser.Screenshot(t, chromium, browser.FileURL(t, file), 1280, 1800)
	if k, err := browser.CountColor(png, color.RGBA{0xb3, 0x26, 0x1e, 0}, 12); err != nil || k < 20 {
		t.Errorf("screenshot: %d pixels of the commit line's red (%v)", k, err)
	}
	t.Logf("change record of %s: %d bytes, screenshot %s", rep.GetOperationId(), len(page), png)
	if keep := os.Getenv("COT_CHANGE_RECORD_DIR"); keep != "" {
		// To look at: the page and its screenshot outlive the test.
		shot, err := os.ReadFile(png)
		if err == nil {
			err = os.WriteFile(filepath.Join(keep, "change.png"), shot, 0o644)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(keep, "change.html"), []byte(page), 0o644)
		}
		if err != nil {
			t.Errorf("COT_CHANGE_RECORD_DIR: %v", err)
		}
	}
}
