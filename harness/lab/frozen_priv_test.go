package lab_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// frozenFor is how long TestFrozenNodeStagedVsAtomic stops the victim's
// agent: well past the atomic commit lead (at least 1 s in the meter lab,
// more when the prepare round was slow), so that the atomic victim flips
// late, or misses the lateness budget (1 s) and the others are rolled
// back: either way its pairs are split for a while.
const frozenFor = 2 * time.Second

// frozenStagedPairBound is the most a pair may lose on the ring in the
// staged run: 25 ms of probes at 1 ms, what the kernel retirement costs a
// pair on a loaded machine (a CI run: 10 and 11 on two of n2's pairs, 0-4
// on the others; local runs 0-5), far below the atomic run's split (the
// same CI run: 233-245 on each of n2's pairs).
const frozenStagedPairBound = 25

// TestFrozenNodeStagedVsAtomic (the staged strategy's promise: "a frozen node during the switch
// costs nothing but its own switch"). On the meter lab (kernel VXLAN, 8
// nodes, probes every 1 ms to 2 peers, the independent echo ring beside
// the agents' mesh), n2's agent is stopped (SIGSTOP) for frozenFor as the
// switch begins, once per strategy:
//
//   - staged, batches 1,2,100% (n2 is batch 2 alone): n2 switches when it
//     thaws; every node listens on both ports meanwhile, so no pair may
//     lose more than a staged change loses anyway (frozenStagedPairBound
//     per pair, on the ring: the agents' own mesh cannot see while n2's
//     agent is stopped). The rollout waits for n2 (its verify reads n2's
//     mesh): it costs time, not traffic.
//   - atomic: the others flip at the instant, n2 when it thaws (or, past
//     the lateness budget, the others are rolled back): the ring must see
//     n2's pairs lose more than in the staged run, and at least 20. This
//     is the contrast, and what shows the ring would see a staged loss.
//
// Both reports must carry n2's stall (>= 1 s), which shows the freeze fell
// inside each operation. Figures go to the meter results
// (results/meter_agreement.json, make lab-meter) and docs/staged.md.
func TestFrozenNodeStagedVsAtomic(t *testing.T) {
	testenv.RequireRoot(t)
	const victim = "n2"
	e, idle := meterLab(t, "", "--verify-budget", "5s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := newMeterRun(t, idle)
	run.Fault = fmt.Sprintf("%s's agent frozen %s (SIGSTOP) as the switch begins", victim, frozenFor)
	isCommit := func(line string) bool {
		f := strings.Fields(line)
		return len(f) > 1 && f[1] == "commit"
	}
	measure := func(what string, args []string) (*coordinatorv1.Report, map[string]uint64) {
		t.Helper()
		ring, err := e.l.StartEchoRing(meterInterval, meterPeers)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		cmd, sc, lines := e.startUntil(ctx, args, isCommit)
		p, err := e.l.Proc("agent", victim)
		if err != nil {
			t.Fatal(err)
		}
		if err := lab.Freeze(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lab.Thaw(p) })
		time.Sleep(frozenFor)
		if err := lab.Thaw(p); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		_ = cmd.Wait() // the state is read from the report below
		ring.Stop(300 * time.Millisecond)
		out, _ := e.run(ctx, "ctl", "status", "-o", "json")
		rep := &coordinatorv1.Report{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), rep); err != nil {
			t.Fatalf("%s: status: %v\n%s\n%s", what, err, out, strings.Join(lines, "\n"))
		}
		from, to := meshWindow(rep)
		op := agree(rep, ring.Pairs(from, to))
		op.Op, op.LoadAvgAfter = what, loadavg()
		op.Violations, op.PairExcess, op.OutsideTight = nil, nil, nil // a stopped agent's mesh is not compared here
		lost := map[string]uint64{}
		for _, pr := range op.Pairs {
			lost[pr.From+"→"+pr.To] = pr.RingLost
		}
		var stall time.Duration
		for _, nr := range rep.GetNodes() {
			if nr.GetNode() == victim {
				stall = time.Duration(nr.GetProbeStallMicros()) * time.Microsecond
			}
		}
		t.Logf("%s: %s (%s): ring lost %d/%d (worst pair %d, gap %.1f ms), %s's agent %s behind; ring lost per pair %v",
			what, rep.GetState(), rep.GetError(), op.RingLost, op.RingSent, op.RingMaxPair, op.RingGapMS, victim, stall, lost)
		if stall < time.Second {
			t.Errorf("%s: %s's agent says it fell behind its mesh by %s: the %s freeze did not fall inside the operation\n%s", what, victim, stall, frozenFor, strings.Join(lines, "\n"))
		}
		run.Ops = append(run.Ops, op)
		time.Sleep(500 * time.Millisecond)
		return rep, lost
	}

	staged, stagedLost := measure("staged 8472→4889, n2 (batch 2) frozen as batch 1 switches",
		[]string{"cutover", "--port", "4889", "--strategy", "staged", "--batches", "1,2,100%"})
	if staged.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("staged with %s frozen: %s (%s), want SUCCEEDED", victim, staged.GetState(), staged.GetError())
	}
	for pair, l := range stagedLost {
		if l > frozenStagedPairBound {
			t.Errorf("staged with %s frozen: pair %s lost %d on the ring, bound %d", victim, pair, l, frozenStagedPairBound)
		}
	}
	e.wantOn(4889)

	atomic, atomicLost := measure("atomic 4889→8472, n2 frozen at the commit",
		[]string{"cutover", "--port", "8472", "--allow-tunnel-port"})
	if st := atomic.GetState(); st != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED && st != coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK {
		t.Fatalf("atomic with %s frozen: %s (%s), want SUCCEEDED (late) or ROLLED_BACK (past the budget)", victim, st, atomic.GetError())
	}
	victimPairs := func(lost map[string]uint64) (sum uint64) {
		for pair, l := range lost {
			if strings.Contains(pair, victim) {
				sum += l
			}
		}
		return sum
	}
	sl, al := victimPairs(stagedLost), victimPairs(atomicLost)
	t.Logf("%s's pairs on the ring: staged lost %d, atomic %d", victim, sl, al)
	if al < 20 || al <= 2*sl {
		t.Errorf("%s's pairs lost %d on the ring in the atomic run against %d staged: want the atomic split to show (>= 20 and over twice the staged loss), else the ring would not see a staged loss either", victim, al, sl)
	}
	writeMeter(t, run)
}
