package runner

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/metrics"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/probes"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// Journal writes an operation's record (the coordinator's journal).
type Journal interface {
	// Save writes the record now and the report's encoding in the
	// background: what a restarted coordinator decides from is on disk
	// when it returns.
	Save(op *opstate.Op) error
	// SaveFinal writes the record and its report together, after any
	// background encoding: the record an ended run leaves.
	SaveFinal(op *opstate.Op) error
}

// Slot is the coordinator's single operation slot, under its lock.
type Slot interface {
	sync.Locker
	// TakeLocked records op and makes it the running operation.
	TakeLocked(op *opstate.Op)
	// FreeLocked frees the slot if op holds it.
	FreeLocked(op *opstate.Op)
}

// Runner runs operations. Its fields are set once, by the coordinator.
type Runner struct {
	Ctx      context.Context // operations run under it, not under an RPC's
	WG       *sync.WaitGroup // Close waits for the runs
	Cfg      config.Config
	Fleet    *fleet.Fleet
	Mesh     *probes.Mesh
	Metrics  *metrics.Metrics
	Verifier model.Verifier // the operation-wide verifier, or nil
	Hooks    []model.Hook
	Log      *slog.Logger
	Journal  Journal
	Slot     Slot
}

// Launch records op and runs first (the core's first actions) in the
// background. The caller holds the slot.
func (rn *Runner) Launch(op *opstate.Op, first []barrier.Action) {
	done := make(chan struct{})
	rn.Slot.Lock()
	rn.Slot.TakeLocked(op)
	op.Mu.Lock()
	op.Running = true
	op.Done = done
	op.Mu.Unlock()
	rn.Slot.Unlock()
	rn.WG.Go(func() { rn.drive(op, first, done) })
}

// drive runs the event loop of one operation run: it performs the core's
// actions and feeds their results back as events. It decides nothing: what
// happens next, and in which order, is the core's (internal/barrier and
// its golden scenarios). Only drive touches op.Core while op.Running.
func (rn *Runner) drive(op *opstate.Op, acts []barrier.Action, done chan struct{}) {
	defer close(done)
	// Nor does a background encoding of the report (save).
	defer op.Encoders.Wait()
	evCh := make(chan barrier.Event, 64)
	stop := make(chan struct{})
	// The run's calls end with it (they stop with rn.Ctx), so that none
	// writes the journal after the run handed the operation over.
	var calls sync.WaitGroup
	defer calls.Wait()
	defer close(stop)
	post := func(ev barrier.Event) {
		select {
		case evCh <- ev:
		case <-stop:
		}
	}
	for {
		rn.perform(op, acts, post, &calls)
		if op.Core.Outcome() != barrier.Pending {
			var more bool
			if acts, more = rn.endRun(op); !more {
				return
			}
			continue
		}
		select {
		case ev := <-evCh:
			if rn.Ctx.Err() != nil {
				// Stopping (the Lease lost?) while a call ran: act on
				// nothing more, a Commit least of all. The journal says
				// where the operation is; the next run resumes or undoes
				// it.
				rn.stopRun(op)
				return
			}
			acts = op.Core.Step(ev)
		case reason := <-op.Rollback:
			op.Emit("rollback", "", "rollback requested: "+reason, false, nil)
			acts = op.Core.Step(barrier.RollbackRequested{Reason: reason})
		case <-rn.Ctx.Done():
			rn.stopRun(op)
			return
		}
	}
}

// perform carries out actions in order. Those that wait on agents or
// hooks run in the background (in calls) and post their event when done;
// Journal and Declare are done before the next action.
func (rn *Runner) perform(op *opstate.Op, acts []barrier.Action, post func(barrier.Event), calls *sync.WaitGroup) {
	// The probe reset the core put in a Send: the ResetProbes beside it
	// waits for that Send's calls and resets only the agents they did not.
	var rides *probes.PrepReset
	for _, a := range acts {
		if s, ok := a.(barrier.Send); ok && s.ResetProbes {
			rides = probes.NewPrepReset()
		}
	}
	for _, a := range acts {
		switch a := a.(type) {
		case barrier.Journal:
			if err := rn.enterStep(op, a); err != nil && !ignoreJournalErrors() {
				// Fed back at once, before the actions it heads: the
				// core decides what follows (a Commit the journal cannot
				// record is not sent).
				next := op.Core.Step(barrier.JournalFailed{Step: a.Step, Attempt: a.Attempt, Err: err.Error()})
				rn.perform(op, next, post, calls)
				if a.Required {
					return
				}
			}
		case barrier.Send:
			rn.announce(op, a)
			var reset *probes.PrepReset
			if a.ResetProbes {
				reset = rides
			}
			calls.Go(func() {
				if reset != nil {
					defer close(reset.Done)
				}
				if a.After > 0 {
					// A retry's back-off, asked by the core (it has no
					// clock).
					t := time.NewTimer(a.After)
					defer t.Stop()
					select {
					case <-t.C:
					case <-rn.Ctx.Done():
						return // drive stops the run
					}
				}
				rn.dispatch(op, a, post, reset)
			})
		case barrier.ResetProbes:
			carried := rides
			if !a.Rode {
				carried = nil
			}
			calls.Go(func() { rn.Mesh.Reset(op, carried); post(barrier.ProbesReset{}) })
		case barrier.ReadProbes:
			calls.Go(func() { rn.Mesh.Stats(op, false); post(barrier.ProbesRead{}) })
		case barrier.CallHook:
			calls.Go(func() { post(rn.callHook(op, a)) })
		case barrier.RunVerifier:
			calls.Go(func() { post(rn.runVerifier(op, a)) })
		case barrier.Declare:
			rn.declare(op, a)
		}
	}
}

// runVerifier runs the built-in probe mesh verifier, then the
// operation-wide one when given.
func (rn *Runner) runVerifier(op *opstate.Op, a barrier.RunVerifier) barrier.Event {
	ctx, cancel := context.WithTimeout(rn.Ctx, a.Timeout)
	defer cancel()
	if !rn.Cfg.NoProbeVerify {
		if err := rn.Mesh.Verify(ctx, op); err != nil {
			op.Emit("verify", "", "verification failed: "+err.Error(), true, nil)
			return barrier.Verified{Err: err.Error()}
		}
	}
	if rn.Verifier == nil {
		op.BatchDone(a.Batch, time.Now(), true)
		return barrier.Verified{}
	}
	if err := rn.Verifier.Verify(ctx, model.VerifyInput{OperationID: op.Rec.ID, FromPort: op.From, ToPort: op.To, Nodes: a.Nodes}); err != nil {
		op.Emit("verify", "", "verification failed: "+err.Error(), true, nil)
		return barrier.Verified{Err: err.Error()}
	}
	op.BatchDone(a.Batch, time.Now(), true)
	return barrier.Verified{}
}

// stopRun ends a run at shutdown (or when the Lease is lost): the
// operation stays where it is. The journal says where; the next start (or
// leader) resumes or undoes it, and the agents' dead-man timers cover a
// commit in between.
func (rn *Runner) stopRun(op *opstate.Op) {
	rn.Slot.Lock()
	defer rn.Slot.Unlock()
	op.Emit(string(op.Core.Phase()), "", "coordinator stopping: the operation resumes at the next start", true, op.Snapshot())
	op.Mu.Lock()
	op.Running = false
	op.Mu.Unlock()
	rn.Slot.FreeLocked(op)
}

// enterStep closes the previous step's duration and journals the step
// about to be sent: after a crash the record must never claim less than
// what the agents may have seen (commit_sent in particular). It returns
// the journal's error, for the core.
func (rn *Runner) enterStep(op *opstate.Op, j barrier.Journal) error {
	now := time.Now()
	op.Mu.Lock()
	prev, started := op.CurStep, op.StepStart
	if prev != "" && prev != j.Step {
		d := now.Sub(started)
		if prev == barrier.Prepare {
			op.PrepDur = d
		}
		op.EndPhaseLocked(prev, d, now)
		rn.Metrics.PhaseDuration.WithLabelValues(string(prev)).Observe(d.Seconds())
	}
	if prev != j.Step {
		op.StepStart = now
	}
	op.CurStep = j.Step
	op.Rec.Step = string(j.Step)
	op.Rec.CommitSent = j.CommitSent
	op.Mu.Unlock()
	rn.Metrics.SetPhase(string(j.Step))
	return rn.Journal.Save(op)
}

// announce tells the operation's followers a step is being sent.
func (rn *Runner) announce(op *opstate.Op, s barrier.Send) {
	msg := fmt.Sprintf("%s: sending to %d agent(s)", s.Step, len(s.Nodes))
	switch {
	case s.Attempt > 1 && s.After > 0:
		msg = fmt.Sprintf("%s: retrying %s in %s (attempt %d)", s.Step, strings.Join(s.Nodes, ","), s.After, s.Attempt)
	case s.Attempt > 1:
		msg += fmt.Sprintf(" (attempt %d)", s.Attempt)
	}
	op.EmitEvent(&coordinatorv1.OperationEvent{Phase: string(s.Step), Message: msg, StepNodes: s.Nodes})
}

// declare records the outcome; endRun finishes the run.
func (rn *Runner) declare(op *opstate.Op, d barrier.Declare) {
	var next []string
	if d.Outcome == barrier.Succeeded {
		next = rn.nextSteps(op.Info())
	}
	if phase, took, ok := op.Declared(opstate.Declaration{Declare: d, NextSteps: next, SpreadTarget: rn.Cfg.SpreadTarget,
		Sending: op.Core.Sending(), Now: time.Now()}); ok {
		rn.Metrics.PhaseDuration.WithLabelValues(string(phase)).Observe(took.Seconds())
	}
	rn.Metrics.Operations.WithLabelValues(d.Outcome.String()).Inc()
	rn.Metrics.SetPhase("idle")
}

// endRun reads every node's final state into the report, journals it,
// sends the last event and frees the slot. A rollback requested while the
// run was ending is taken instead (more is true and acts are its actions).
func (rn *Runner) endRun(op *opstate.Op) (acts []barrier.Action, more bool) {
	out := op.Core.Outcome()
	if out == barrier.Held {
		rn.Mesh.Park(op)
	}
	ctx, cancel := context.WithTimeout(rn.Ctx, op.Step)
	fleet.FanOut(op.Nodes, func(n string) {
		info, err := rn.Fleet.Agent(n).Client.Info(ctx, &agentv1.InfoRequest{})
		if err != nil {
			return
		}
		op.NoteReadBack(n, info)
	})
	cancel()
	// The outcome is declared: a final record the journal cannot take
	// leaves the last step's, which a later run resumes from (an ended
	// operation's steps replay safely). writeRecord tells the followers.
	_ = rn.Journal.SaveFinal(op)
	rep := op.Snapshot()
	rn.Slot.Lock()
	select {
	case reason := <-op.Rollback:
		if acts := op.Core.Step(barrier.RollbackRequested{Reason: reason}); len(acts) > 0 {
			rn.Slot.Unlock()
			op.Reopen()
			op.Emit("rollback", "", "rollback requested: "+reason, false, nil)
			return acts, true
		}
	default:
	}
	msg := "operation " + out.String()
	if rep.Error != "" {
		msg += ": " + rep.Error
	}
	// The last event goes out before running turns false, so that a
	// Rollback stream started after this never sees it as its own end.
	op.Emit("done", "", msg, out != barrier.Succeeded && out != barrier.Held, rep)
	op.Mu.Lock()
	op.Running = false
	op.Mu.Unlock()
	rn.Slot.FreeLocked(op)
	rn.Slot.Unlock()
	rn.Log.Info("operation ended", "operation", op.Rec.ID, "outcome", out.String(), "error", rep.Error)
	return nil, false
}
