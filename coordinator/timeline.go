package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/pkg/pki"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// The change record's data: when each node reached each step, who asked
// for the operation, and the events. Recorded as the run goes, so a
// report of a running, aborted or rolled-back operation has it too.

// noteTimeline records in node's result when a step's answer shows the
// node got there (coordinator clock). st is the agent's status when the
// answer carried one.
func (op *operation) noteTimeline(node string, s barrier.Send, ev barrier.Event, st *agentv1.OperationStatus) {
	r, ok := ev.(barrier.Reply)
	if !ok || !r.OK {
		return
	}
	now := time.Now().UnixNano()
	op.mu.Lock()
	offset := op.offsets[node].Offset.Nanoseconds()
	op.mu.Unlock()
	op.setResult(node, func(nr *coordinatorv1.NodeResult) {
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
	if nr.PreparedUnixNano == 0 && nr.AppliedUnixNano == 0 && !phaseIn(st.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
		return
	}
	nr.RevertedUnixNano, nr.RevertedBy = now, step
}

// noteReadBack records what endRun read back from node's agent.
func (op *operation) noteReadBack(node string, info *agentv1.InfoResponse) {
	op.mu.Lock()
	offset := op.offsets[node].Offset.Nanoseconds()
	op.mu.Unlock()
	op.setResult(node, func(r *coordinatorv1.NodeResult) {
		r.Port = info.GetCurrentPort()
		r.Backend, r.Device = info.GetBackend(), info.GetDevice()
		if o := info.GetOperation(); o != nil && o.GetOperationId() == op.rec.ID {
			r.AgentPhase = o.GetPhase().String()
			if phaseIn(o.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
				noteReverted(r, "", 0, o, offset)
			}
		}
	})
}

// eventsLocked is the operation's event log for its report: the events of
// runs before a coordinator restart (from the journal), then this run's,
// without the final report they carry. op.mu is held.
func (op *operation) eventsLocked() []*coordinatorv1.OperationEvent {
	out := make([]*coordinatorv1.OperationEvent, 0, len(op.priorEvents)+len(op.events))
	out = append(out, op.priorEvents...)
	for _, e := range op.events {
		c := proto.Clone(e).(*coordinatorv1.OperationEvent)
		c.Report = nil
		out = append(out, c)
	}
	return out
}

// requestedByKey carries the original caller's identity when a follower
// forwards a request to the leader.
const requestedByKey = "cutover-requested-by"

// requester says who made the call of ctx: the client certificate's
// subject and role and the peer address, or "unauthenticated" without TLS.
// A call forwarded by another coordinator names the caller it forwarded.
func requester(ctx context.Context) string {
	from, who, role := "unknown address", "unauthenticated (no TLS)", ""
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			from = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			leaf := ti.State.PeerCertificates[0]
			role, _ = pki.RoleOf(leaf)
			who = fmt.Sprintf("%+q (role %s, serial %s)", leaf.Subject.CommonName, role, leaf.SerialNumber)
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && role == pki.RoleCoordinator {
		if v := md.Get(requestedByKey); len(v) > 0 && v[0] != "" {
			return v[0] + ", forwarded by coordinator " + who
		}
	}
	return who + " from " + from
}
