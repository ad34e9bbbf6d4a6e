package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/preflight"
	"github.com/cutover-dev/cutover/coordinator/internal/staging"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Staged subsets (docs/staged.md, "Subsets"). A staged cutover with
// --nodes/--selector has every node listen on both ports but switches only
// the targets, then ends Held: the untargeted nodes keep listening on both
// and sending the old port, so every node still receives every port any
// node sends on. A held operation outlives its run: it is journaled as
// such, survives a coordinator restart, is never pruned, and is the only
// thing a later cutover may do until it ends. A cutover to the same port
// with the staged strategy continues it (the same operation, more
// batches); when every node sends the new port the old one is retired as
// usual. A rollback undoes it whole: every sender back, then every
// listener.

// heldOp returns the held operation, if any (there is at most one: while
// it is held no other operation starts).
func (c *Coordinator) heldOp() *opstate.Op {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, op := range c.ops {
		op.Mu.Lock()
		held := op.Rec.Held()
		op.Mu.Unlock()
		if held {
			return op
		}
	}
	return nil
}

// continueHeld runs the next part of held operation op: the request's
// targets (every node still listening when it names none) switch in
// batches; if then every node sends the new port, the old one is retired.
func (c *Coordinator) continueHeld(op *opstate.Op, req *coordinatorv1.CutoverRequest, r preflight.Request, stream grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	op.Mu.Lock()
	id, from, to, nodes := op.Rec.ID, op.From, op.To, op.Nodes
	switched := slices.Clone(op.Rec.Switched)
	waveReq := op.Rec.MaxParallel
	op.Mu.Unlock()
	targets, err := staging.Continue(staging.Held{ID: id, From: from, To: to, Nodes: nodes, Switched: switched},
		staging.Ask{OperationID: req.OperationId, Subset: r.Subset, Targets: r.Targets, Inventory: c.fleet.Inventory().NodeNames()})
	if err != nil {
		return err
	}
	batches, err := staging.PlanBatches(req.Batches, targets)
	if err != nil {
		return err
	}
	wave := waveReq
	if req.MaxParallel > 0 {
		wave = staging.WaveSize(int(req.MaxParallel), len(nodes))
	}
	// The agents parked their probe sample when the operation was held:
	// plan it again (a restarted coordinator does not have it either), so
	// that every batch of this run is verified over the whole mesh.
	pr := r
	pr.Nodes, pr.Step = nodes, op.Step
	pp := c.check.PlanProbes(stream.Context(), pr, nil)
	if len(pp.Problems) > 0 {
		return status.Errorf(codes.FailedPrecondition, "continuing held operation %s: probe mesh: %s (nothing changed)", id, strings.Join(pp.Problems, "; "))
	}
	then := retireNote(len(switched)+len(targets) == len(nodes), from)
	if req.DryRun {
		rep := op.Snapshot()
		return stream.Send(&coordinatorv1.OperationEvent{OperationId: id, Phase: "preflight", UnixNano: time.Now().UnixNano(), Report: rep,
			Message: fmt.Sprintf("dry run: operation %s is held (%s); would switch %d more node(s) to %d (%s)%s; nothing was changed",
				id, opstate.HeldSummary(op), len(targets), to, model.Abbreviate(targets, 10), then)})
	}
	c.mu.Lock()
	err = c.claimLocked(op)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	summary := opstate.HeldSummary(op)
	op.ContinueBatches(batches, wave)
	op.Mu.Lock()
	op.Rec.Batches, op.Rec.MaxParallel = batches, wave
	op.ProbePeers, op.ProbePairs, op.ProbePlanned = pp.Peers, pp.Pairs, true
	op.Mu.Unlock()
	cfg := c.run.CoreConfig(nodes, op.Step, op.Deadman, op.Rec.Hooks, batches)
	cfg.Switched = switched
	op.Core = barrier.New(cfg)
	op.Reopen()
	op.Mu.Lock()
	first := len(op.Events)
	op.Mu.Unlock()
	op.Emit("continue", "", fmt.Sprintf("continuing held operation %s (%s): switching %d more node(s) in %d batch(es)%s",
		id, summary, len(targets), len(batches), then), false, nil)
	c.run.Launch(op, op.Core.Start())
	return op.Follow(stream, first)
}

func retireNote(all bool, from tunnelport.Port) string {
	if all {
		return ", then retire port " + from.String() + " on every node"
	}
	return ", and stay held"
}
