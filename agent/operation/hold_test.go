package operation

import (
	"context"
	"testing"
	"time"
)

// appliedSaved says whether the applied commit's record (afterCommit's
// save) is in the store, and at which save.
func (e *env) appliedSaved() (int, bool) {
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	for i, p := range e.store.points {
		if p.rec.Phase == PhaseCommitted && !p.rec.Applied.IsZero() {
			return i, true
		}
	}
	return 0, false
}

// wantHeld fails unless the after-work has not run, a little after the
// call that could have started it.
func (e *env) wantHeld(when string) {
	e.t.Helper()
	time.Sleep(50 * time.Millisecond) // unheld, the save takes well under this
	if _, ok := e.appliedSaved(); ok {
		e.t.Fatalf("%s: the applied commit was recorded during the hold", when)
	}
}

// waitApplied waits until the after-work recorded the applied commit.
func (e *env) waitApplied(when string) int {
	e.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if i, ok := e.appliedSaved(); ok {
			return i
		}
	}
	e.t.Fatalf("%s: the applied commit was never recorded", when)
	return 0
}

func (e *env) committed(budget time.Duration) {
	e.t.Helper()
	if _, err := e.m.Prepare(context.Background(), opA, from, to); err != nil {
		e.t.Fatal(err)
	}
	r, err := e.m.CommitWithin(context.Background(), opA, t0.Add(time.Second), deadman, budget, time.Time{})
	if err != nil || r.Phase != PhaseCommitted {
		e.t.Fatalf("commit: %+v, %v", r, err)
	}
}

// An answered commit's after-work (its record, the backend's cleanup)
// waits until the instant plus the lateness budget: by then every node
// that applies has begun to, and on a shared kernel the work no longer
// runs beside another node's window. With no budget the cap stands in.
func TestAfterCommitWaitsForTheOtherWindows(t *testing.T) {
	for _, tc := range []struct {
		name        string
		budget, cap time.Duration
		wantHold    time.Duration
	}{
		{"the budget", 200 * time.Millisecond, 500 * time.Millisecond, 200 * time.Millisecond},
		{"no budget: the cap", 0, 500 * time.Millisecond, 500 * time.Millisecond},
		{"a budget over the cap", 2 * time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newHoldEnv(t, tc.cap)
			e.committed(tc.budget) // the fake clock is at the instant now
			e.wantHeld("at the instant")
			e.clock.Advance(tc.wantHold - time.Millisecond)
			e.wantHeld("just before the hold's end")
			e.clock.Advance(time.Millisecond)
			e.waitApplied("at the hold's end")
			if got := e.clock.Now().Sub(t0.Add(time.Second)); got != tc.wantHold {
				t.Fatalf("recorded %s after the instant, want %s", got, tc.wantHold)
			}
		})
	}
}

// The next command does not wait for the hold: it ends it, and the
// after-work still runs before the command (here Confirm, with the
// clock never moved past the instant).
func TestCommandEndsTheAfterCommitHold(t *testing.T) {
	e := newHoldEnv(t, 500*time.Millisecond)
	e.committed(200 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Confirm(context.Background(), opA)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("confirm: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("confirm waited for the hold")
	}
	applied := e.waitApplied("after confirm")
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	for i, p := range e.store.points {
		if p.rec.Phase == PhaseConfirmed && i < applied {
			t.Fatalf("CONFIRMED recorded (save %d) before the applied commit (save %d)", i, applied)
		}
	}
	if got := e.clock.Now(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("clock at %s: the test never moves it past the instant", got)
	}
}

// No hold: the after-work runs at once (the unit tests' default, and
// the agent's with Options.AfterCommitHold zero).
func TestNoAfterCommitHold(t *testing.T) {
	e := newHoldEnv(t, 0)
	e.committed(200 * time.Millisecond)
	e.waitApplied("with no hold")
}
