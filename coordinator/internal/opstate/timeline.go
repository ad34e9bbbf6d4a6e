package opstate

import (
	"slices"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/protobuf/proto"
)

// eventsLocked is the operation's event log for its report: the events of
// runs before a coordinator restart (from the journal), then this run's,
// without the final report they carry. op.Mu is held.
func (op *Op) eventsLocked() []*coordinatorv1.OperationEvent {
	out := make([]*coordinatorv1.OperationEvent, 0, len(op.PriorEvents)+len(op.Events))
	out = append(out, op.PriorEvents...)
	for _, e := range op.Events {
		c := proto.Clone(e).(*coordinatorv1.OperationEvent)
		c.Report = nil
		out = append(out, c)
	}
	return out
}

// PhaseIn reports whether p is one of ps.
func PhaseIn(p agentv1.Phase, ps ...agentv1.Phase) bool { return slices.Contains(ps, p) }

// CoordClock turns an agent-clock instant into the coordinator's clock (0
// stays 0: not measured).
func CoordClock(agentNanos, offsetNanos int64) int64 {
	if agentNanos == 0 {
		return 0
	}
	return agentNanos - offsetNanos
}
