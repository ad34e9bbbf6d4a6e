package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/preflight"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ListAgents implements CoordinatorService: every agent, asked now.
func (c *Coordinator) ListAgents(ctx context.Context, _ *coordinatorv1.ListAgentsRequest) (*coordinatorv1.ListAgentsResponse, error) {
	if err := c.fleet.Refresh(ctx); err != nil {
		return nil, inventoryUnread(err)
	}
	inv := c.fleet.Inventory()
	out := make([]*coordinatorv1.Agent, len(inv.Agents))
	ready := 0
	idx := map[string]int{}
	for i, s := range inv.Agents {
		idx[s.Node] = i
	}
	fleet.FanOut(inv.NodeNames(), func(n string) {
		ac := c.fleet.Agent(n)
		a := &coordinatorv1.Agent{Node: n, Address: ac.Spec.Address, Labels: ac.Spec.Labels}
		out[idx[n]] = a
		cctx, cancel := context.WithTimeout(ctx, c.cfg.StepTimeout)
		defer cancel()
		info, err := ac.Client.Info(cctx, &agentv1.InfoRequest{})
		if err != nil {
			a.Error = status.Convert(err).Message()
			return
		}
		a.Version, a.Backend, a.Device, a.CurrentPort, a.Ready, a.NotReady = info.Version, info.Backend, info.Device, info.CurrentPort, info.Ready, info.NotReady
		if len(a.Labels) == 0 {
			a.Labels = info.Labels
		}
		if cs, err := c.fleet.MeasureClock(cctx, ac.Client); err == nil {
			a.ClockOffsetNanos, a.RttNanos = cs.Offset.Nanoseconds(), cs.RTT.Nanoseconds()
		}
	})
	for _, a := range out {
		if a.Ready {
			ready++
		}
	}
	c.metrics.AgentsReady.Set(float64(ready))
	return &coordinatorv1.ListAgentsResponse{Agents: out}, nil
}

// Plan implements CoordinatorService: preflight only; changes nothing.
func (c *Coordinator) Plan(ctx context.Context, req *coordinatorv1.CutoverRequest) (*coordinatorv1.PlanResponse, error) {
	if err := c.fleet.Refresh(ctx); err != nil {
		return nil, inventoryUnread(err)
	}
	r, err := c.check.ValidateTarget(ctx, req)
	if err != nil {
		return nil, err
	}
	r = c.check.ResolveAuto(ctx, r)
	resp := c.check.Full(ctx, r, "cutover").Resp
	resp.Strategy, resp.StrategyReason = r.Strategy(), r.StrategyReason
	return resp, nil
}

// inventoryUnread is a refresh that failed: like a preflight problem,
// nothing was changed and the operator can act on the cause.
func inventoryUnread(err error) error {
	return status.Errorf(codes.FailedPrecondition, "cannot read the inventory, nothing was changed: %v", err)
}

func refused(pf *preflight.Result) error {
	return status.Errorf(codes.FailedPrecondition, "preflight refused the cutover, nothing was changed:\n  %s", strings.Join(pf.Problems, "\n  "))
}

// Cutover implements CoordinatorService.
func (c *Coordinator) Cutover(req *coordinatorv1.CutoverRequest, stream grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	return c.cutover(req, stream, "")
}

// cutover runs a cutover; reverts names the succeeded operation it rolls
// back when it is a reverse cutover.
func (c *Coordinator) cutover(req *coordinatorv1.CutoverRequest, stream grpc.ServerStreamingServer[coordinatorv1.OperationEvent], reverts string) error {
	ctx := stream.Context()
	if err := c.fleet.Refresh(ctx); err != nil {
		return inventoryUnread(err)
	}
	r, err := c.check.ValidateTarget(ctx, req)
	if err != nil {
		return err
	}
	kind := "cutover"
	if reverts != "" {
		kind = "rollback"
	}
	if held := c.heldOp(); held != nil {
		if r.Staged && !r.Auto && r.To == held.To && reverts == "" {
			return c.continueHeld(held, req, r, stream)
		}
		what := fmt.Sprintf("%s cutover to port %d", map[bool]string{false: "an atomic", true: "a staged"}[r.Staged], r.To)
		if r.Auto {
			what = fmt.Sprintf("a cutover to port %d with strategy %s", r.To, r.AutoName())
		}
		if reverts != "" {
			what = "the reverse cutover of " + reverts
		}
		return opstate.RefuseBesideHeld(held, what)
	}
	r = c.check.ResolveAuto(ctx, r)
	if r.Auto {
		_ = stream.Send(&coordinatorv1.OperationEvent{OperationId: r.ID, Phase: "preflight", Message: r.StrategyReason, UnixNano: time.Now().UnixNano()})
	}
	// Preflight at hundreds of nodes takes a while: its progress goes out
	// on the stream as it happens (a refusal then ends the stream).
	var sendMu sync.Mutex
	r.Progress = func(ev *coordinatorv1.OperationEvent) {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = stream.Send(ev) // a client gone is noticed when the run is followed
	}
	if req.DryRun {
		pf := c.check.Full(ctx, r, kind)
		if len(pf.Problems) > 0 {
			return refused(pf)
		}
		rep := &coordinatorv1.Report{OperationId: r.ID, FromPort: pf.From.Wire(), ToPort: r.To.Wire(), Strategy: r.Strategy(), StrategyReason: r.StrategyReason}
		for _, np := range pf.Resp.Nodes {
			rep.Nodes = append(rep.Nodes, &coordinatorv1.NodeResult{Node: np.Node, Port: np.CurrentPort})
			if err := stream.Send(&coordinatorv1.OperationEvent{OperationId: r.ID, Phase: "preflight", Node: np.Node,
				Message: "would: " + strings.Join(np.Actions, "; "), UnixNano: time.Now().UnixNano()}); err != nil {
				return err
			}
		}
		return stream.Send(&coordinatorv1.OperationEvent{OperationId: r.ID, Phase: "preflight", UnixNano: time.Now().UnixNano(),
			Message: fmt.Sprintf("dry run: preflight passed; %d node(s) would move from %d to %d; nothing was changed", len(r.Nodes), pf.From, r.To), Report: rep})
	}
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	op := opstate.New(r.ID, kind, 0, r.To, r.Nodes, r.Step, c.run.DeadmanFor(r.Step), seq)
	b := opstate.Beginning{Kind: kind, Reverts: reverts, Strategy: r.Strategy(), StrategyReason: r.StrategyReason}
	if r.Staged {
		op.Rec.Batches, op.Rec.MaxParallel = r.Batches, r.MaxParallel
		b.Batches, b.MaxParallel = r.Batches, r.MaxParallel
	}
	op.Begin(b)
	op.Core = barrier.New(c.run.CoreConfig(r.Nodes, op.Step, op.Deadman, nil, r.Batches))
	if err := c.reserve(op); err != nil {
		return err
	}
	started := time.Now()
	c.metrics.SetPhase("preflight")
	pf := c.check.Full(ctx, r, kind)
	if len(pf.Problems) > 0 {
		c.metrics.SetPhase("idle")
		c.release(op)
		return refused(pf)
	}
	p := opstate.Preflight{From: pf.From, RequestedBy: requester(ctx), Request: req, Plan: pf.Resp, Started: started, Took: time.Since(started),
		Clocks: map[string]fleet.ClockSample{}}
	for n, nc := range pf.Checks {
		p.Clocks[n] = nc.Clock
	}
	if pp := pf.Probes; pp != nil {
		op.ProbePeers, op.ProbePairs, op.ProbePlanned = pp.Peers, pp.Pairs, true
		p.Warnings = append(p.Warnings, pp.Warnings...)
		for _, w := range append(slices.Clone(pp.Notes), pp.Warnings...) {
			op.Emit("preflight", "", w, false, nil)
		}
	}
	p.Warnings = append(p.Warnings, pf.PathWarnings...)
	op.Preflighted(p)
	for _, w := range pf.PathWarnings {
		op.Emit("preflight", "", w, false, nil)
	}
	for _, n := range pf.Resp.GetPathCheck().GetNotes() { // what the path check saw that is no problem (a node's own firewall)
		op.Emit("preflight", "", "underlay path check: "+n, false, nil)
	}
	// The record must exist on disk before any agent hears of the operation.
	op.Rec.Step = "preflight"
	if err := c.save(op); err != nil {
		c.metrics.SetPhase("idle")
		c.release(op)
		return status.Errorf(codes.Internal, "cannot journal operation %s (%s), nothing was changed: %v", r.ID, describeJournal(c.journal, c.cfg), err)
	}
	op.Emit("preflight", "", fmt.Sprintf("preflight passed: %d node(s) on port %d, target %d", len(r.Nodes), pf.From, r.To), false, nil)
	c.run.Launch(op, op.Core.Start())
	return op.Follow(stream, 0)
}

func (c *Coordinator) lookup(id string) (*opstate.Op, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == "" {
		if c.current != nil && c.ops[c.current.Rec.ID] == c.current {
			return c.current, nil
		}
		id = c.lastID
		if id == "" {
			return nil, status.Error(codes.NotFound, "no operation has run yet")
		}
	}
	op, ok := c.ops[id]
	if !ok && c.pruned[id] {
		return nil, status.Errorf(codes.NotFound, "operation_id %q: pruned: it ended and the journal keeps only the last %d finished operations (--journal-keep)", id, c.cfg.KeptOperations())
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "operation_id %q: no such operation in the journal: it keeps the last %d finished operations (--journal-keep), so one older than those was pruned", id, c.cfg.KeptOperations())
	}
	return op, nil
}

// Status implements CoordinatorService.
func (c *Coordinator) Status(_ context.Context, req *coordinatorv1.StatusRequest) (*coordinatorv1.Report, error) {
	op, err := c.lookup(req.OperationId)
	if err != nil {
		return nil, err
	}
	return op.Snapshot(), nil
}

// Rollback implements CoordinatorService. A running operation is rolled
// back at its next barrier; a succeeded (or failed) one is rolled back now.
func (c *Coordinator) Rollback(req *coordinatorv1.RollbackRequest, stream grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	op, err := c.lookup(req.OperationId)
	if err != nil {
		return err
	}
	c.mu.Lock()
	op.Mu.Lock()
	from, running := len(op.Events), op.Running
	op.Mu.Unlock()
	if running {
		// The run in flight takes it at its next barrier, or as it ends.
		select {
		case op.Rollback <- "operator requested rollback":
		default:
		}
		c.mu.Unlock()
		return op.Follow(stream, from)
	}
	if op.Rec.Kind == "rollback" && op.Rec.Outcome == "succeeded" {
		c.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "operation %s is the rollback of %s and it succeeded: there is nothing to roll back; to move the port again, run a cutover", op.Rec.ID, op.Reverts())
	}
	if op.Rec.Outcome == "succeeded" {
		// Every node is finalized on the new port and the old port's
		// firewall rules are gone: putting it back node by node would flip
		// nodes apart and before the old port is open again (I2). Rolling
		// back a finished change is a cutover in reverse, with its own
		// preflight, barrier and verification.
		c.mu.Unlock()
		nodes := op.Nodes
		if op.Strategy() == StrategyStaged {
			nodes = nil // staged covers every node of the inventory
		}
		return c.cutover(&coordinatorv1.CutoverRequest{
			Port: op.From.Wire(), Nodes: nodes, TimeoutMillis: op.Step.Milliseconds(),
			// The prior port is known good for this overlay even when it
			// is a tunnel port (4789) or in the NodePort range.
			AllowTunnelPort: true, AllowNodeportRange: true,
			// Putting a change back must not be refused for a node
			// without probing: the result is flagged instead.
			AllowUnprobed: true,
			// A staged change goes back staged (a canary, then the
			// rest): as lossless back as it was forward.
			Strategy: op.Strategy(),
		}, stream, op.Rec.ID)
	}
	err = c.claimLocked(op)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	acts := op.Core.Step(barrier.RollbackRequested{Reason: "operator requested rollback"})
	if len(acts) == 0 {
		c.mu.Lock()
		op.Mu.Lock()
		op.Running = false
		op.Mu.Unlock()
		c.current = nil
		c.mu.Unlock()
		rep := op.Snapshot()
		return stream.Send(&coordinatorv1.OperationEvent{OperationId: op.Rec.ID, Phase: "rollback", UnixNano: time.Now().UnixNano(),
			Message: fmt.Sprintf("nothing to roll back: operation is %s", rep.State), Report: rep})
	}
	op.Reopen()
	c.run.Launch(op, acts)
	return op.Follow(stream, from)
}

// Resume loads the journal and, for every operation that did not end,
// finishes or undoes it (in the background; Wait waits for it):
//
//   - commit never sent → abort: Rollback to every agent. Nothing flipped,
//     so undoing is always safe and quicker than re-checking a prepare
//     that may be stale.
//   - commit sent → ask every agent's Status for the operation. If every
//     agent is committed (or confirmed) on the target port, verify, then
//     confirm and finalize: the change was made everywhere and undoing a
//     good change would be a second disruption. Otherwise (any agent not
//     committed, unreachable, already reverted by its dead-man timer, or
//     the operation was rolling back) roll back everyone.
func (c *Coordinator) Resume(ctx context.Context) error {
	recs, err := c.journal.Load()
	for _, rec := range recs {
		step := rec.StepTimeout()
		op := opstate.New(rec.ID, rec.Kind, rec.FromPort, rec.ToPort, rec.Nodes, step, c.run.DeadmanFor(step), rec.Seq)
		op.Rec = rec
		// A report the journal kept that no longer decodes leaves the
		// record: the operation resumes from it, with an empty report.
		_ = op.Restore(rec.Report)
		if op.Step <= 0 {
			op.Step = c.cfg.StepTimeout
		}
		op.Core = barrier.New(c.run.CoreConfig(rec.Nodes, op.Step, op.Deadman, rec.Hooks, rec.Batches))
		for _, n := range rec.Nodes {
			// Only an operation this start must finish or undo needs
			// every node: a finished (or held) one naming a node that
			// left the cluster must not keep the coordinator from
			// starting; a rollback of it counts that node unreached.
			if !rec.Terminal() && c.fleet.Known(n) == nil {
				return fmt.Errorf("journal: operation %s names node %s, which is not in the inventory: add it back so the operation can be finished or undone", rec.ID, n)
			}
		}
		c.mu.Lock()
		c.ops[rec.ID] = op
		c.lastID = rec.ID
		c.seq = max(c.seq, rec.Seq)
		c.mu.Unlock()
		if rec.Terminal() {
			// Rollback of a finished operation starts from this core.
			op.Core = c.doneCore(rec)
			continue
		}
		if c.ctx.Err() != nil {
			break // stopping (the Lease lost?): the next run takes it
		}
		last := barrier.Step(rec.Step)
		var point barrier.Resume
		if len(rec.Batches) > 0 {
			point = barrier.ChooseStagedResume(rec.CommitSent, last)
		} else {
			allCommitted := false
			if barrier.NeedsAgents(rec.CommitSent, last) {
				allCommitted = c.allCommitted(ctx, op)
			}
			point = barrier.ChooseResume(rec.CommitSent, last, allCommitted)
		}
		c.log.Warn("resuming interrupted operation", "operation", rec.ID, "step", rec.Step, "commit_sent", rec.CommitSent, "resume", point)
		op.Emit("resume", "", fmt.Sprintf("coordinator restarted during %s: %s", rec.Step, map[barrier.Resume]string{
			barrier.ResumeAbort: "aborting", barrier.ResumeVerify: "every agent is committed: verifying", barrier.ResumeRollback: "rolling back",
			barrier.ResumeFinalize: "every batch was confirmed: finishing the old port's retirement"}[point]), false, nil)
		c.run.Launch(op, op.Core.ResumeAt(point))
		// Only one operation can have been running; any other non-terminal
		// record is older and was superseded, but handle it the same way
		// after this one.
		c.Wait()
	}
	// A journal holding more than --journal-keep (an earlier coordinator
	// kept more) is pruned in memory now, on disk when the next
	// operation ends.
	c.pruneOps()
	return err
}

// doneCore rebuilds a terminal operation's core so Rollback works on it.
// A succeeded (or failed) one is rolled back on every node (for failed,
// every node too: the journal does not keep the unreached list
// separately); any other has nothing left to undo.
func (c *Coordinator) doneCore(rec Record) *barrier.Op {
	step := rec.StepTimeout()
	op := barrier.New(c.run.CoreConfig(rec.Nodes, step, c.run.DeadmanFor(step), rec.Hooks, rec.Batches))
	switch rec.Outcome {
	case "succeeded", "failed":
		op.Ended(barrier.Succeeded, "")
	case "held":
		op.Ended(barrier.Held, "")
	default:
		op.Ended(barrier.Aborted, "journal: already "+rec.Outcome)
	}
	return op
}

// allCommitted asks every target whether it is committed on the target
// port; an agent that does not answer counts as not committed.
func (c *Coordinator) allCommitted(ctx context.Context, op *opstate.Op) bool {
	cctx, cancel := context.WithTimeout(ctx, op.Step)
	defer cancel()
	allCommitted := true
	var mu sync.Mutex
	fleet.FanOut(op.Nodes, func(n string) {
		st, err := c.fleet.Agent(n).Client.Status(cctx, &agentv1.StatusRequest{OperationId: op.Rec.ID})
		good := err == nil && st.CurrentPort == op.To.Wire() &&
			opstate.PhaseIn(st.Phase, agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED)
		if !good {
			mu.Lock()
			allCommitted = false
			mu.Unlock()
		}
	})
	return allCommitted
}

// PathCheck implements CoordinatorService: the path check alone, on the
// request's port and nodes. Changes nothing.
func (c *Coordinator) PathCheck(ctx context.Context, req *coordinatorv1.CutoverRequest) (*coordinatorv1.PathCheckResult, error) {
	if err := c.fleet.Refresh(ctx); err != nil {
		return nil, inventoryUnread(err)
	}
	return c.check.PathCheck(ctx, req)
}
