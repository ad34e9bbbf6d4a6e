package opstate

import (
	"fmt"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The staged strategy (docs/staged.md): every node listens on both ports,
// the senders switch batch by batch with the probe mesh verified after
// each, then the old port is retired. The barrier core runs it
// (barrier.Config.Batches); internal/staging cuts the batches; this file
// keeps where each node is and stamps the report's batches as they pass.

// Staged node states, as NodeResult.staged spells them.
const (
	stagedListening = "listening"
	stagedSwitched  = "switched"
	stagedRetired   = "retired"
)

// HeldSummary says where a held operation's nodes are, for messages.
func HeldSummary(op *Op) string {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	listening := ListeningLocked(op)
	return fmt.Sprintf("every node listens on %d and %d; %d of %d send %d (%s), %d still send %d (%s)",
		op.From, op.To, len(op.Rec.Switched), len(op.Nodes), op.To, model.Abbreviate(op.Rec.Switched, 10), len(listening), op.From, model.Abbreviate(listening, 10))
}

func ListeningLocked(op *Op) []string {
	sw := model.SetOf(op.Rec.Switched)
	var out []string
	for _, n := range op.Nodes {
		if !sw[n] {
			out = append(out, n)
		}
	}
	return out
}

// RefuseBesideHeld is the error for any operation but the held one's
// continuation.
func RefuseBesideHeld(op *Op, what string) error {
	id := op.Rec.ID
	return status.Errorf(codes.FailedPrecondition,
		"operation %s is held (staged, part of the nodes switched: %s): %s would change nodes in the middle of it; continue it with coordctl cutover --port %d --strategy staged [--nodes ...|--selector ...], or undo it with coordctl rollback %s",
		id, HeldSummary(op), what, op.To, id)
}
