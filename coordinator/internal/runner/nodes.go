package runner

import (
	"fmt"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// noteNode records a failed agent answer in the node result and as an event.
func (rn *Runner) noteNode(op *opstate.Op, node string, ev barrier.Event) {
	var msg string
	switch e := ev.(type) {
	case barrier.Reply:
		if e.OK {
			msg = fmt.Sprintf("%s: ok", e.Step)
			if (e.Step == barrier.Abort || e.Step == barrier.Rollback) && e.Attempt > 1 {
				// Reached by a retry: say so next to the failed attempts.
				msg = fmt.Sprintf("%s: reached at attempt %d", e.Step, e.Attempt)
				op.NoteNodeError(node, msg, true)
			}
			// Every answer is an event (node_done): clients count the
			// step's progress and name its slowest node.
			op.EmitEvent(&coordinatorv1.OperationEvent{Phase: string(e.Step), Node: node, Message: msg, NodeDone: true})
			return
		}
		msg = fmt.Sprintf("%s failed: %s", e.Step, e.Err)
	case barrier.Timeout:
		msg = fmt.Sprintf("%s: no answer within the step deadline", e.Step)
	default:
		return
	}
	op.NoteNodeError(node, msg, false)
	op.EmitEvent(&coordinatorv1.OperationEvent{Phase: op.CurPhase(), Node: node, Message: msg, Failed: true, NodeDone: true})
}
