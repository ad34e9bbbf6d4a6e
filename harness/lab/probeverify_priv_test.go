package lab_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The probe mesh verifier on real OVS, agents and coordinator (I7): the
// underlay drops the new port to and from n2 only, so after the flip every
// read-back is fine but n2's tunnel carries nothing. The path check names
// it at preflight; with --allow-path-problems the cutover goes on. The cutover must be
// ROLLED_BACK naming n2's pairs, every node back on the old port. Then the
// same fault with the verifier off (--probe-verify=false) reports
// SUCCEEDED (flagged, exit 7): the verifier is what caught it.
func TestProbeVerifyDarkNodeOVS(t *testing.T) {
	testenv.RequirePrivileged(t, append(ovsBins, "go", "nft")...)
	bin := labtest.Binaries(t)
	cfg := newConfig(t, lab.BackendOVS, 4)
	cfg.StartProcesses = true
	cfg.AgentBin = filepath.Join(bin, "agent")
	cfg.CoordinatorBin = filepath.Join(bin, "coordinator")
	cfg.ProbeInterval = e2eInterval
	e := &e2eLab{t: t, l: up(t, cfg), cutoverLab: filepath.Join(bin, "cutover-lab")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.warmProbes()
	if err := e.l.BlackholeOverlay(ctx, "n2", 4889); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.l.ClearBlackhole(context.Background(), "n2") })

	// The underlay path check sees it first (docs/pathcheck.md): plan
	// refuses, naming n2's pairs. --allow-path-problems goes ahead, so
	// that the verifier meets the dark node after the flip.
	if out, code := e.run(ctx, "plan", "--port", "4889"); code != 4 || !strings.Contains(out, "n1→n2,n2→n1,n2→n3,n2→n4,n3→n2,n4→n2") {
		t.Fatalf("plan with n2 blackholed on 4889: exit %d, want 4 naming n2's pairs:\n%s", code, out)
	}
	rep := e.report(ctx, 1, "cutover", "--port", "4889", "--allow-path-problems")
	if rep.GetState() != coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK {
		t.Fatalf("cutover with n2's tunnel dark: %s (%s), want ROLLED_BACK", rep.GetState(), rep.GetError())
	}
	// 4 nodes, k=3 (the lab's default: all): n2's six pairs, and no other.
	for _, p := range []string{"n1→n2", "n3→n2", "n4→n2", "n2→n1", "n2→n3", "n2→n4"} {
		if !strings.Contains(rep.GetError(), p+" ") {
			t.Errorf("error does not name %s: %s", p, rep.GetError())
		}
	}
	for _, p := range []string{"n1→n3", "n3→n4", "n4→n1"} {
		if strings.Contains(rep.GetError(), p+" ") {
			t.Errorf("error names %s, which works: %s", p, rep.GetError())
		}
	}
	t.Logf("rolled back: %s", rep.GetError())
	wantPorts(t, e.l, portMap(e.l, 4789, nil))
	// Nothing used 4889 before the flip: n2's pairs lost their probes from
	// the commit on, and the report places them there.
	for _, d := range rep.GetDisruption() {
		if d.GetFrom() != "n2" && d.GetTo() != "n2" {
			continue
		}
		var after uint64
		for _, l := range d.GetLostByPhase() {
			if !slices.Contains([]string{"", "preflight", "prepare"}, l.GetPhase()) {
				after += l.GetLost()
			}
		}
		if after == 0 || 2*after <= d.GetLost() {
			t.Errorf("pair %s→%s: %d lost, %d of them placed from the commit on (%v), want most", d.GetFrom(), d.GetTo(), d.GetLost(), after, d.GetLostByPhase())
		}
	}
	wantLossPlaced(t, rep)
	t.Logf("lost %d, by phase %v", rep.GetProbesLost(), rep.GetLostByPhase())

	// The same fault, verifier off: the run the bug would have given.
	if _, err := e.l.KillCoordinator(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := e.l.SpawnCoordinator("--probe-verify=false"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, code := e.run(ctx, "ctl", "status"); code != 3 && code != 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("coordinator without the verifier not serving after 20s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	off := e.report(ctx, 7, "cutover", "--port", "4889", "--allow-path-problems")
	if off.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || len(off.GetWarnings()) == 0 {
		t.Fatalf("verifier off: %s warnings %q, want SUCCEEDED flagged", off.GetState(), off.GetWarnings())
	}
	t.Logf("verifier off: %s, warnings %q", off.GetState(), off.GetWarnings())
}
