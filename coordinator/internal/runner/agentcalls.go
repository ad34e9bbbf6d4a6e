package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/probes"
	"github.com/cutover-dev/cutover/coordinator/internal/staging"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// callResult classifies an agent call: ok, failed with a message, or
// timed out.
func callResult(node string, s barrier.Send, err error, ok bool, why string) barrier.Event {
	if err != nil {
		st := status.Convert(err)
		if st.Code() == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
			return barrier.Timeout{Node: node, Step: s.Step, Attempt: s.Attempt}
		}
		return barrier.Reply{Node: node, Step: s.Step, Attempt: s.Attempt, Err: fmt.Sprintf("%s: %s", st.Code(), st.Message())}
	}
	return barrier.Reply{Node: node, Step: s.Step, Attempt: s.Attempt, OK: ok, Err: why}
}

// dispatch sends one step to its agents in parallel and posts one event
// per agent (plus a Deadline backstop).
// A first Prepare carries the probe counters' reset when reset is not nil
// (probes.PrepReset).
func (rn *Runner) dispatch(op *opstate.Op, s barrier.Send, post func(barrier.Event), reset *probes.PrepReset) {
	id := op.Rec.ID
	timeout := s.Timeout
	var commitAt time.Time
	var late *lateWatch
	op.Mu.Lock()
	staged := len(op.Rec.Batches) > 0
	switched := model.SetOf(op.Rec.Switched) // a held operation's switched nodes
	op.Mu.Unlock()
	if s.Step == barrier.Commit && !staged {
		lead := rn.commitLead(op)
		commitAt = time.Now().Add(lead)
		timeout += lead
		op.Mu.Lock()
		op.CommitAt = commitAt
		op.Mu.Unlock()
		late = rn.watchLate(op, s, commitAt, post)
		defer late.stop()
	}
	// Staged, the phases that change a node's datapath go in waves of
	// MaxParallel nodes; the step's bound covers every wave.
	var wave chan struct{}
	deadman := op.Deadman
	if staged && op.Rec.MaxParallel > 0 && slices.Contains([]barrier.Step{barrier.Prepare, barrier.Commit, barrier.Finalize}, s.Step) {
		wave = make(chan struct{}, op.Rec.MaxParallel)
		timeout, deadman = staging.Bounds(len(s.Nodes), op.Rec.MaxParallel, s.Timeout, deadman)
	}
	backstop := time.AfterFunc(timeout+time.Second, func() { post(barrier.Deadline{Step: s.Step, Attempt: s.Attempt}) })
	defer backstop.Stop()
	ctx, cancel := context.WithTimeout(rn.Ctx, timeout)
	defer cancel()
	sent := time.Now()
	strategy := op.Strategy()
	var mesh bool
	switch s.Step {
	case barrier.Prepare:
		op.Mu.Lock()
		op.PrepAnswers = op.PrepAnswers[:0]
		op.Mu.Unlock()
	case barrier.Verify:
		// The read-back brings the probe figures when the mesh verifier
		// that follows will judge them: it then reads no sender twice.
		op.Mu.Lock()
		mesh = !rn.Cfg.NoProbeVerify && (len(op.ProbePairs) > 0 || !op.ProbePlanned)
		op.Mu.Unlock()
	}
	fleet.FanOut(s.Nodes, func(n string) {
		if wave != nil {
			wave <- struct{}{}
			defer func() { <-wave }()
		}
		cl := rn.Fleet.Agent(n).Client
		var ev barrier.Event
		switch s.Step {
		case barrier.Prepare:
			r, err := cl.Prepare(ctx, &agentv1.PrepareRequest{OperationId: id, FromPort: op.From.Wire(), ToPort: op.To.Wire(), ProbePeers: op.ProbePeers[n], Strategy: strategy,
				ResetProbeStats: reset != nil})
			if reset != nil {
				reset.Answered(n, r, err)
			}
			op.Mu.Lock()
			op.PrepAnswers = append(op.PrepAnswers, time.Since(sent))
			op.Mu.Unlock()
			ph := r.GetStatus().GetPhase()
			op.NoteSelfUndo(n, r.GetStatus())
			ok := ph == agentv1.Phase_PHASE_PREPARED
			if switched[n] {
				// A held operation's node that an earlier run switched:
				// the replayed Prepare answers where it is.
				ok = ph == agentv1.Phase_PHASE_CONFIRMED && r.GetStatus().GetCurrentPort() == op.To.Wire()
			}
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s: %s", ph, r.GetStatus().GetError()))
			op.NoteTimeline(n, s, ev, r.GetStatus())
		case barrier.Commit:
			req := &agentv1.CommitRequest{OperationId: id, DeadmanMillis: deadman.Milliseconds()}
			if !staged {
				// A staged switch has no instant: every node keeps
				// receiving on both ports, so each switches when asked.
				req.AtUnixNano = commitAt.Add(op.Offsets[n].Offset).UnixNano()
				req.LateBudgetMillis = rn.lateBudgetMillis()
				if dl, ok := ctx.Deadline(); ok {
					// The agent refuses a commit it reaches after this
					// call was given up (it was frozen): this node is
					// counted away from then on, and the others may be
					// moved back.
					req.AbandonUnixNano = dl.Add(op.Offsets[n].Offset).UnixNano()
				}
			}
			r, err := cl.Commit(ctx, req)
			got := time.Now()
			ph := r.GetStatus().GetPhase()
			op.NoteSelfUndo(n, r.GetStatus())
			ok := err == nil && opstate.PhaseIn(ph, agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED) && r.ReadbackPort == op.To.Wire()
			off := op.Offsets[n].Offset.Nanoseconds()
			var appliedAt int64
			if err == nil {
				appliedAt = opstate.CoordClock(r.AppliedUnixNano, off)
			}
			late.answer(n, appliedAt, r)
			if d, ok := agentv1.LatenessOf(err); ok {
				late.refused(n, d)
			}
			if err == nil {
				a := opstate.CommitAnswer{Applied: r.AppliedUnixNano - off, ApplyNanos: r.ApplyNanos,
					Written: opstate.CoordClock(r.WrittenUnixNano, off), Effective: opstate.CoordClock(r.EffectiveUnixNano, off),
					Received:   opstate.CoordClock(r.ReceivedUnixNano, off),
					AnswerSent: opstate.CoordClock(r.AnsweredUnixNano, off), AnswerReceived: got.UnixNano()}
				if r.AnsweredUnixNano != 0 && r.AppliedUnixNano != 0 {
					a.ApplyToAnswer = r.AnsweredUnixNano - r.AppliedUnixNano
				}
				op.NoteCommit(n, a)
			}
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s, read back port %d (want %d): %s", ph, r.GetReadbackPort(), op.To, r.GetStatus().GetError()))
			if rep, isReply := ev.(barrier.Reply); isReply && rep.OK {
				// Judged by the core against the budget: when the node
				// applied, not when this answer came.
				rep.Lateness = late.lateness(n, appliedAt)
				ev = rep
			}
		case barrier.Verify:
			info, err := cl.Info(ctx, &agentv1.InfoRequest{ProbeStats: mesh})
			if ps := info.GetProbeStats(); ps != nil {
				op.Mu.Lock()
				if op.VerifyStats == nil {
					op.VerifyStats = map[string]*agentv1.ProbeStatsResponse{}
				}
				op.VerifyStats[n] = ps
				op.Mu.Unlock()
			}
			o := info.GetOperation()
			// Staged: the device keeps its own port until the retirement;
			// what switched is where the node sends, which the agent read
			// back into its record (the operation's current port).
			port := info.GetCurrentPort()
			if staged {
				port = o.GetCurrentPort()
			}
			ok := port == op.To.Wire() && o.GetOperationId() == id &&
				opstate.PhaseIn(o.GetPhase(), agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED)
			ev = callResult(n, s, err, ok, fmt.Sprintf("read back port %d (want %d), operation %q %s", port, op.To, o.GetOperationId(), o.GetPhase()))
		case barrier.Confirm:
			r, err := cl.Confirm(ctx, &agentv1.ConfirmRequest{OperationId: id})
			ok := opstate.PhaseIn(r.GetPhase(), agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED)
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
			op.NoteTimeline(n, s, ev, r)
		case barrier.Finalize:
			r, err := cl.Finalize(ctx, &agentv1.FinalizeRequest{OperationId: id})
			ev = callResult(n, s, err, r.GetPhase() == agentv1.Phase_PHASE_FINALIZED, fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
			op.NoteTimeline(n, s, ev, r)
		case barrier.Unswitch:
			r, err := cl.Rollback(ctx, &agentv1.RollbackRequest{OperationId: id, Reason: op.Core.Reason(), SendOnly: true})
			if status.Code(err) == codes.NotFound {
				err = nil // never saw the operation: sends the old port
				r = &agentv1.OperationStatus{Phase: agentv1.Phase_PHASE_IDLE}
			}
			// Switched back: listening on both (PREPARED), or never
			// further than that, or already undone.
			ok := !opstate.PhaseIn(r.GetPhase(), agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED, agentv1.Phase_PHASE_FAILED)
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
		case barrier.Abort, barrier.Rollback:
			r, err := cl.Rollback(ctx, &agentv1.RollbackRequest{OperationId: id, Reason: op.Core.Reason()})
			if err != nil && status.Code(err) != codes.NotFound && ctx.Err() == nil {
				// Before counting the node as not reached, ask where it
				// is: an agent that undid the operation by itself (its
				// dead-man, its prepare timeout) or never saw it is done,
				// whatever made the Rollback call fail.
				if st, serr := cl.Status(ctx, &agentv1.StatusRequest{OperationId: id}); serr == nil && undone(st) {
					r, err = st, nil
				} else if status.Code(serr) == codes.NotFound {
					err = serr
				}
			}
			if status.Code(err) == codes.NotFound {
				err = nil // the agent never saw the operation: nothing to undo
				r = &agentv1.OperationStatus{Phase: agentv1.Phase_PHASE_IDLE}
			}
			ev = callResult(n, s, err, undone(r), fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
			op.NoteTimeline(n, s, ev, r)
		}
		rn.noteNode(op, n, ev)
		post(ev)
	})
	if s.Step == barrier.Commit && !staged {
		rn.commitSpread(op)
	}
	if s.Batch > 0 && s.Step == barrier.Commit {
		op.BatchDone(s.Batch, time.Now(), false)
	}
}

// undone reports whether an agent's status means the operation is undone
// on it, or was never done: nothing prepared, committed or stuck there.
func undone(st *agentv1.OperationStatus) bool {
	return !opstate.PhaseIn(st.GetPhase(), agentv1.Phase_PHASE_PREPARED, agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED,
		agentv1.Phase_PHASE_FINALIZED, agentv1.Phase_PHASE_FAILED)
}

// commitSpread sets the report's spreads (opstate.EndCommit) and their
// gauges.
func (rn *Runner) commitSpread(op *opstate.Op) {
	s := op.EndCommit()
	if s.HasCommit {
		rn.Metrics.CommitSpread.Set(s.Commit.Seconds())
	}
	if s.HasEffect {
		rn.Metrics.EffectSpread.Set(s.Effect.Seconds())
	}
	if s.HasMargin {
		rn.Metrics.CommitMargin.Set(s.Margin.Seconds())
	}
}
