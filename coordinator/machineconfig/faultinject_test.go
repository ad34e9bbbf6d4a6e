//go:build cutover_faultinject

package machineconfig

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/mcdsim"
)

// TestDrainGuardBites is the test of the drain guard (STYLE.md "a safety
// test must bite"): a driver that answers the MCD's drain request without
// draining (drainless, faultinject.go), the MCD reboots a node that still
// runs a PDB-guarded pod, and the guard must say so. It has its own
// kube-apiserver: the default build runs it alone, through a build with
// the tag (faultinject_off_test.go).
func TestDrainGuardBites(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mcdsim.Kubelet(ctx, e.cs, 50*time.Millisecond)
	f := e.pool(t, "bite", 1)
	e.pod(t, "default", "work-"+f.nodes[0], f.nodes[0], nil)
	guard := e.guardDrains(t, ctx, f)
	e.daemons(t, ctx, f, nil)
	broken := &Driver{C: e.d.C}
	drainless = broken
	t.Cleanup(func() { drainless = nil })
	if _, err := broken.Rollout(ctx, e.options(f)); err != nil {
		t.Fatalf("rollout: %v", err)
	}
	// The answer's watch event may trail the rollout's end by a moment.
	deadline := time.Now().Add(10 * time.Second)
	err := guard.err()
	for err != nil && strings.Contains(err.Error(), "no drain answer") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		err = guard.err()
	}
	if err == nil || !strings.Contains(err.Error(), "not cordoned") {
		t.Fatalf("the drain was skipped, yet the guard passed the run: %v", err)
	}
	t.Logf("the guard fails the broken run, as it must: %v", err)
}
