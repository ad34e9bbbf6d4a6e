package operation

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
)

const (
	dumpListening = "port=4789 fw=[4789 4889] rx2=4889 send=4789"
	dumpSwitched  = "port=4789 fw=[4789 4889] rx2=4889 send=4889"
)

func TestStagedHappyPath(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r, err := e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)
	wantCode(t, err, 0)
	if r.Phase != PhasePrepared || !r.Staged() || !r.PrepareDeadline.IsZero() || len(e.clock.Pending()) != 0 {
		t.Fatalf("staged prepare: %+v timers %v (want no prepare timeout)", r, e.clock.Pending())
	}
	e.wantDump(dumpListening)
	r, err = e.m.Commit(ctx, opA, time.Time{}, deadman)
	wantCode(t, err, 0)
	if r.Phase != PhaseCommitted || r.ReadbackPort != to || len(e.clock.Pending()) != 1 {
		t.Fatalf("staged commit: %+v timers %v", r, e.clock.Pending())
	}
	e.wantDump(dumpSwitched)
	wantCode(t, mustErr(e.m.Confirm(ctx, opA)), 0)
	r, err = e.m.Finalize(ctx, opA)
	wantCode(t, err, 0)
	if r.Phase != PhaseFinalized || r.CurrentPort != to {
		t.Fatalf("staged finalize: %+v", r)
	}
	e.wantDump(dumpFinalized)
	if got, want := e.be.Calls(), []string{"Listen 4789->4889", "SwitchSend 4789->4889", "Retire 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %q, want %q", got, want)
	}
}

func mustErr(_ Record, err error) error { return err }

// TestStagedDeadmanOnlySwitchesSendingBack: an unconfirmed staged node
// stops sending the new port at its deadline but keeps listening on it (a
// peer may send it); only a full rollback unlistens.
func TestStagedDeadmanOnlySwitchesSendingBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
	e.advance(deadman)
	r, _ := e.m.Status(opA)
	if r.Phase != PhasePrepared || r.RevertedBy != ByDeadman || r.CurrentPort != from || e.obs.deadmanCount() != 1 {
		t.Fatalf("after the dead-man: %+v", r)
	}
	e.wantDump(dumpListening)
	if _, err := e.m.Confirm(ctx, opA); CodeOf(err) != CodeFailedPrecondition {
		t.Fatalf("confirm after the dead-man: %v, want refused (the coordinator then rolls back)", err)
	}
	r, err := e.m.Rollback(ctx, opA, "test")
	wantCode(t, err, 0)
	if r.Phase != PhaseAborted {
		t.Fatalf("full rollback: %+v", r)
	}
	e.wantDump(dumpIdle)
}

// TestStagedDeadmanBites: with the dead-man undoing a staged node the
// atomic way, the node stops listening on the new port by itself, which
// TestStagedDeadmanOnlySwitchesSendingBack must catch.
func TestStagedDeadmanBites(t *testing.T) {
	testFullDeadman = true
	t.Cleanup(func() { testFullDeadman = false })
	e := newEnv(t)
	ctx := context.Background()
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
	e.advance(deadman)
	if got := e.be.Dump(); got == dumpListening {
		t.Fatalf("dead-man with the atomic undo left %q: the guard test would pass without its guard", got)
	}
	if rx := e.be.Receives(); slices.Contains(rx, to) {
		t.Fatalf("receives %v after a full dead-man undo, want the new port dropped", rx)
	}
}

func TestStagedRollbackSendOnlyThenFull(t *testing.T) {
	ctx := context.Background()
	for _, confirm := range []bool{false, true} {
		e := newEnv(t)
		wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
		wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
		if confirm {
			wantCode(t, mustErr(e.m.Confirm(ctx, opA)), 0)
		}
		for range 2 { // the replay changes nothing
			r, err := e.m.RollbackScope(ctx, opA, "batch failed", true)
			wantCode(t, err, 0)
			if r.Phase != PhasePrepared || r.RevertedBy != ByRollback || len(e.clock.Pending()) != 0 {
				t.Fatalf("send-only rollback (confirmed=%t): %+v timers %v", confirm, r, e.clock.Pending())
			}
			e.wantDump(dumpListening)
		}
		r, err := e.m.Rollback(ctx, opA, "")
		wantCode(t, err, 0)
		if r.Phase != PhaseAborted {
			t.Fatalf("full rollback: %+v", r)
		}
		e.wantDump(dumpIdle)
	}
	// Straight to a full rollback from COMMITTED: sending back, then
	// unlistening, in that order.
	e := newEnv(t)
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
	r, err := e.m.Rollback(ctx, opA, "")
	wantCode(t, err, 0)
	if r.Phase != PhaseReverted || r.CurrentPort != from {
		t.Fatalf("full rollback from COMMITTED: %+v", r)
	}
	e.wantDump(dumpIdle)
	if got := e.be.Calls(); !slices.Equal(got[len(got)-2:], []string{"UnswitchSend 4789->4889", "Unlisten 4789->4889"}) {
		t.Fatalf("calls %q: want UnswitchSend then Unlisten last", got)
	}
}

func TestStagedListeningNeverTimesOut(t *testing.T) {
	e := newEnv(t)
	wantCode(t, mustErr(e.m.PrepareStrategy(context.Background(), opA, from, to, StrategyStaged)), 0)
	e.advance(24 * time.Hour)
	if e.phase() != PhasePrepared {
		t.Fatalf("a listening node stopped by itself: %s", e.phase())
	}
	e.wantDump(dumpListening)
}

// TestStagedRestart: a record persisted COMMITTED resumes as the staged
// dead-man would: past its deadline the node only switches sending back.
func TestStagedRestart(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
	e.m.Close()
	e.clock.Advance(time.Hour)
	e.start()
	r, _ := e.m.Status("")
	if r.Phase != PhasePrepared || r.RevertedBy != ByDeadman || !r.Staged() {
		t.Fatalf("resumed past the deadline: %+v", r)
	}
	e.wantDump(dumpListening)
	e.m.Close()
	e.clock.Advance(time.Hour)
	e.start() // PREPARED staged: still no prepare timeout after a restart
	if len(e.clock.Pending()) != 0 || e.phase() != PhasePrepared {
		t.Fatalf("resumed listening node: %s timers %v", e.phase(), e.clock.Pending())
	}
}

type atomicOnly struct{ dataplane.Backend }

func TestStagedBadInput(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	_, err := e.m.PrepareStrategy(ctx, opA, from, to, "fast")
	wantCode(t, err, CodeInvalidArgument, `strategy "fast"`, "atomic", "staged")
	e.wantDump(dumpIdle)

	wantCode(t, mustErr(e.m.Prepare(ctx, opA, from, to)), 0)
	_, err = e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)
	wantCode(t, err, CodeInvalidArgument, "prepared with strategy atomic", "says staged")
	e.wantDump(dumpPrepared)
	_, err = e.m.RollbackScope(ctx, opA, "", true)
	wantCode(t, err, CodeInvalidArgument, "send_only", "atomic")
	e.wantDump(dumpPrepared)

	be := dataplane.NewFake("ovs", "vxlan0", from)
	m, err := New(ctx, Options{Backend: atomicOnly{be}, Store: &memStore{}, Clock: NewFakeClock(t0), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = m.PrepareStrategy(ctx, opB, from, to, StrategyStaged)
	wantCode(t, err, CodeFailedPrecondition, "does not support the staged strategy", "nothing changed")
	if be.Dump() != dumpIdle {
		t.Fatalf("dataplane changed: %s", be.Dump())
	}
}

// TestStagedCommitFailureKeepsListening: a switch that fails is undone on
// this node's sending only (peers may already send the new port).
func TestStagedCommitFailureKeepsListening(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	e.be.FailNext(dataplane.MethodSwitchSend, errors.New("injected"))
	r, err := e.m.Commit(ctx, opA, time.Time{}, deadman)
	wantCode(t, err, CodeAborted, "still listening on both")
	if r.Phase != PhasePrepared || r.RevertedBy != ByApplyFailure {
		t.Fatalf("after a failed switch: %+v", r)
	}
	e.wantDump(dumpListening)
}

// TestStagedListensAgainAfterARestart: a node that rebooted in the middle
// of a staged change (the second receiver, the firewall opening and the
// send ports gone) listens on both ports again when the agent starts,
// whether it was listening or switched; one that cannot is not ready,
// saying why, and tries again until it can.
func TestStagedListensAgainAfterARestart(t *testing.T) {
	ctx := context.Background()
	for _, switched := range []bool{false, true} {
		e := newEnv(t)
		wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
		if switched {
			wantCode(t, mustErr(e.m.Commit(ctx, opA, time.Time{}, deadman)), 0)
			wantCode(t, mustErr(e.m.Confirm(ctx, opA)), 0)
		}
		e.m.Close()
		e.be.Reboot()
		e.wantDump("port=4789 fw=[4789]")
		e.start()
		// Listening again, and a switched node sending the new port
		// again: the coordinator counts it as sending it.
		if switched {
			e.wantDump(dumpSwitched)
		} else {
			e.wantDump(dumpListening)
		}
		if nr := e.m.NotReady(); len(nr) != 0 {
			t.Errorf("switched=%t: not ready after listening again: %v", switched, nr)
		}
	}

	// It cannot listen: not ready, saying why, until a retry succeeds.
	old := relistenRetry
	relistenRetry = 20 * time.Millisecond
	t.Cleanup(func() { relistenRetry = old })
	e := newEnv(t)
	wantCode(t, mustErr(e.m.PrepareStrategy(ctx, opA, from, to, StrategyStaged)), 0)
	e.m.Close()
	e.be.Reboot()
	e.be.SetFailure(dataplane.MethodListen, errors.New("injected: OVS not connected yet"))
	e.start()
	nr := e.m.NotReady()
	if len(nr) != 1 || !strings.Contains(nr[0], "staged operation "+opA+": not listening on port 4889 again") || !strings.Contains(nr[0], "OVS not connected yet") {
		t.Fatalf("not ready = %q", nr)
	}
	e.be.SetFailure(dataplane.MethodListen, nil)
	for deadline := time.Now().Add(5 * time.Second); len(e.m.NotReady()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not ready 5 s after Listen works again: %q", e.m.NotReady())
		}
	}
	e.wantDump(dumpListening)
}
