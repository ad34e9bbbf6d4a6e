package opstate

import (
	"slices"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/protobuf/proto"
)

// The change record's data: when each node reached each step and the
// events. Recorded as the run goes, so a report of a running, aborted or
// rolled-back operation has it too.

// NoteTimeline records in node's result when a step's answer shows the
// node got there (coordinator clock). st is the agent's status when the
// answer carried one.
func (op *Op) NoteTimeline(node string, s barrier.Send, ev barrier.Event, st *agentv1.OperationStatus) {
	r, ok := ev.(barrier.Reply)
	if !ok || !r.OK {
		return
	}
	now := time.Now().UnixNano()
	op.Mu.Lock()
	offset := op.Offsets[node].Offset.Nanoseconds()
	op.Mu.Unlock()
	op.SetResult(node, func(nr *coordinatorv1.NodeResult) {
		switch s.Step {
		case barrier.Prepare:
			nr.PreparedUnixNano = now
		case barrier.Confirm:
			nr.ConfirmedUnixNano = now
		case barrier.Finalize:
			nr.FinalizedUnixNano = now
		case barrier.Abort, barrier.Rollback:
			noteReverted(nr, string(s.Step), now, st, offset)
		}
	})
}

// noteReverted marks nr undone, by what the agent says undid it when it
// says so (its dead-man, its prepare timeout), at the instant it did, else
// by step at now. A node that never saw the operation was not reverted.
func noteReverted(nr *coordinatorv1.NodeResult, step string, now int64, st *agentv1.OperationStatus, offset int64) {
	if nr.RevertedUnixNano != 0 {
		return
	}
	if st.GetRevertedBy() != "" && st.GetUpdatedUnixNano() != 0 {
		nr.RevertedUnixNano, nr.RevertedBy = st.GetUpdatedUnixNano()-offset, st.GetRevertedBy()
		return
	}
	if nr.PreparedUnixNano == 0 && nr.AppliedUnixNano == 0 && !PhaseIn(st.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
		return
	}
	nr.RevertedUnixNano, nr.RevertedBy = now, step
}

// NoteReadBack records what endRun read back from node's agent.
func (op *Op) NoteReadBack(node string, info *agentv1.InfoResponse) {
	op.Mu.Lock()
	offset := op.Offsets[node].Offset.Nanoseconds()
	op.Mu.Unlock()
	op.SetResult(node, func(r *coordinatorv1.NodeResult) {
		r.Port = info.GetCurrentPort()
		r.Backend, r.Device = info.GetBackend(), info.GetDevice()
		if o := info.GetOperation(); o != nil && o.GetOperationId() == op.Rec.ID {
			r.AgentPhase = o.GetPhase().String()
			if PhaseIn(o.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
				noteReverted(r, "", 0, o, offset)
			}
		}
	})
}

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
