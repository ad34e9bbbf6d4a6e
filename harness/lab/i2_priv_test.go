package lab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// faultInjectEnv is agent.FaultInjectEnv (not imported: the lab's tests
// link no agent package).
const faultInjectEnv = "COT_FAULTINJECT_FLIP_AT_PREPARE"

// i2Cutover runs one cutover to 4889 on a 4-node lab of backend with
// strategy (atomic or staged) under the independent I2 observer
// (lab.ObserveI2) and returns it, stopped. The agents come from agentBin.
// To make a flip before the barrier observable every time, n3 is frozen
// (SIGSTOP) as soon as the operation is journaled and released 500 ms
// after n1 recorded its Prepare: a correct barrier waits for n3, so
// nothing flips before n3 opens (staged: listens); an agent that flips at
// Prepare flips while n3 has not.
func i2Cutover(t *testing.T, backend, strategy, agentBin string, mutated bool) (*lab.I2Observer, *coordinatorv1.Report) {
	t.Helper()
	bin := labtest.Binaries(t)
	cfg := newConfig(t, backend, 4)
	cfg.StartProcesses = true
	cfg.AgentBin = agentBin
	cfg.CoordinatorBin = filepath.Join(bin, "coordinator")
	cfg.NoProbes = true
	e := &e2eLab{t: t, l: up(t, cfg), cutoverLab: filepath.Join(bin, "cutover-lab")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	obs, err := e.l.ObserveI2(ctx, 4889)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(obs.Stop)

	held := make(chan error, 1)
	go func() { held <- holdDuringPrepare(e.l, "n3", "n1") }()
	// No probe mesh here (the freeze would only add noise to it), so the
	// success is flagged as not verified: exit 7, never 0.
	rep := e.report(ctx, 7, "cutover", "--port", "4889", "--strategy", strategy)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if rep.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED || rep.GetStrategy() != strategy {
		t.Fatalf("cutover: %s, strategy %q: %s", rep.GetState(), rep.GetStrategy(), rep.GetError())
	}
	// The barrier held in time too, not only in order. A mutated run
	// flips a node at Prepare: the spread bounds must catch that too.
	// The staged change has no commit instant to spread around.
	if strategy == "atomic" {
		if probs := spreadProblems(rep); mutated && len(probs) == 0 {
			t.Errorf("a node flipped at Prepare, yet the commit and effect spreads are within their bounds: %s", rep.GetError())
		} else if !mutated {
			for _, p := range probs {
				t.Error(p)
			}
		}
	}
	// The monitors push; give the last events a moment to arrive.
	time.Sleep(200 * time.Millisecond)
	obs.Stop()
	return obs, rep
}

// holdDuringPrepare freezes hold's agent when the coordinator journals the
// operation and thaws it 500 ms after watch's agent recorded its Prepare
// (PREPARED, or further).
func holdDuringPrepare(l *lab.Lab, hold, watch string) error {
	p, err := l.Proc("agent", hold)
	if err != nil {
		return err
	}
	ops := filepath.Join(l.Dir(), "coordinator", "operations")
	if !spin(20*time.Second, func() bool {
		ents, _ := os.ReadDir(ops)
		for _, de := range ents {
			if strings.HasSuffix(de.Name(), ".json") && !strings.HasPrefix(de.Name(), ".") {
				return true
			}
		}
		return false
	}) {
		return fmt.Errorf("no journal record within 20 s")
	}
	if err := lab.Freeze(p); err != nil {
		return err
	}
	defer func() { _ = lab.Thaw(p) }()
	n, err := l.Node(watch)
	if err != nil {
		return err
	}
	if !spin(10*time.Second, func() bool {
		var r struct{ Phase string }
		b, err := os.ReadFile(filepath.Join(n.StateDir, "operation.json"))
		return err == nil && json.Unmarshal(b, &r) == nil && (r.Phase == "PREPARED" || r.Phase == "COMMITTED")
	}) {
		return fmt.Errorf("%s never recorded its Prepare", watch)
	}
	time.Sleep(500 * time.Millisecond)
	return nil
}

func spin(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// i2Bins are what the observer and the lab need, per backend.
func i2Bins(backend string) []string {
	if backend == lab.BackendOVS {
		return append(ovsBins, "nft", "ovsdb-client", "go")
	}
	return []string{"ip", "bridge", "iptables", "iptables-restore", "iptables-save", "nft", "go"}
}

// rules is what the strategy promises (lab.I2Rules).
func i2Rules(strategy string) lab.I2Rules { return lab.I2Rules{Staged: strategy == "staged"} }

// TestE2EI2Observed: with the real agent, the independent observer sees
// every node open 4889 (staged: and listen on it) before the first node
// flips to it, although one node (n3) is slow to prepare: on OVS, and on
// kernel VXLAN with both strategies.
func TestE2EI2Observed(t *testing.T) {
	for _, tc := range []struct{ backend, strategy string }{
		{lab.BackendOVS, "atomic"}, {lab.BackendKernelVXLAN, "atomic"}, {lab.BackendKernelVXLAN, "staged"},
	} {
		t.Run(tc.backend+"/"+tc.strategy, func(t *testing.T) {
			testenv.RequirePrivileged(t, i2Bins(tc.backend)...)
			obs, _ := i2Cutover(t, tc.backend, tc.strategy, e2eAgent(t), false)
			if err := obs.CheckWith(i2Rules(tc.strategy)); err != nil {
				t.Fatalf("the independent I2 observer: %v", err)
			}
			t.Logf("I2 held: %s", obs.Summary())
		})
	}
}

// TestE2EI2CheckBites is the test of the test (STYLE.md "a safety test
// must bite"): the same runs with an agent built with the test-only tag
// cutover_faultinject, whose n1 flips at Prepare instead of at the commit
// instant (its Commit run at Prepare: the atomic change's flip; the
// staged change's SwitchSend, right after its Listen). The operation
// still reports SUCCEEDED (the coordinator cannot tell), and the observer
// must flag it, on each backend's own monitors.
func TestE2EI2CheckBites(t *testing.T) {
	t.Setenv(faultInjectEnv, "n1") // the lab's agents inherit it; only the tagged build reads it
	for _, tc := range []struct{ backend, strategy, want string }{
		{lab.BackendOVS, "atomic", "I2 violated: n1 flipped to 4889 while n3 had not opened it"},
		{lab.BackendKernelVXLAN, "atomic", "I2 violated: n1 flipped to 4889 while n3 had not opened it"},
		{lab.BackendKernelVXLAN, "staged", "I2 violated: n1 flipped to 4889 while n3 had not opened it"},
	} {
		t.Run(tc.backend+"/"+tc.strategy, func(t *testing.T) {
			testenv.RequirePrivileged(t, i2Bins(tc.backend)...)
			obs, _ := i2Cutover(t, tc.backend, tc.strategy, labtest.FaultInjectAgent(t), true)
			err := obs.CheckWith(i2Rules(tc.strategy))
			if err == nil {
				t.Fatalf("n1 flipped at Prepare, yet the I2 observer passed the run: %s", obs.Summary())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("the observer failed the run, but not for n1 flipping before n3 opened: %v", err)
			}
			t.Logf("the mutated run fails the I2 check, as it must:\n%v", err)
		})
	}
}
