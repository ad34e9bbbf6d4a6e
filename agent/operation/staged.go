package operation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
)

// The staged strategy reuses the machine's phases with other backend
// calls (dataplane.Stager):
//
//	PREPARED   listening on both ports (Listen)
//	COMMITTED  sending on the new port, dead-man armed (SwitchSend)
//	CONFIRMED  sending on the new port, dead-man disarmed
//	FINALIZED  the old port retired (Retire)
//
// Its undo differs from the atomic flip's in one way that matters: the
// dead-man and a send-only rollback switch the node's sending back and
// leave it PREPARED, still listening on both, because a node cannot know
// whether a peer already sends the new port; only the coordinator, once
// no node sends it, has a node stop listening (a full Rollback: Unlisten).

// errNotStager is returned when a staged record meets a backend without
// the staged methods (a downgraded agent binary, say).
// testFullDeadman is the bite switch of TestStagedDeadmanBites: the
// dead-man undoes a staged node entirely, as it does an atomic one.
var testFullDeadman bool

var errNotStager = errors.New("the backend does not support the staged strategy")

func strategyName(s string) string {
	if s == "" {
		return StrategyAtomic
	}
	return s
}

func (m *Machine) stager() (dataplane.Stager, error) {
	st, ok := m.be.(dataplane.Stager)
	if !ok {
		return nil, fmt.Errorf("%s: %w", m.be.Name(), errNotStager)
	}
	return st, nil
}

func (m *Machine) prepareBackend(ctx context.Context, rec Record) error {
	if !rec.Staged() {
		return m.be.Prepare(ctx, *rec.Snapshot)
	}
	st, err := m.stager()
	if err != nil {
		return err
	}
	return st.Listen(ctx, *rec.Snapshot)
}

func (m *Machine) commitBackend(ctx context.Context, rec Record) (dataplane.State, error) {
	if !rec.Staged() {
		return m.be.Commit(ctx, *rec.Snapshot)
	}
	st, err := m.stager()
	if err != nil {
		return dataplane.State{}, err
	}
	return st.SwitchSend(ctx, *rec.Snapshot)
}

func (m *Machine) abortBackend(ctx context.Context, rec Record) error {
	if !rec.Staged() {
		return m.be.Abort(ctx, *rec.Snapshot)
	}
	st, err := m.stager()
	if err != nil {
		return err
	}
	return st.Unlisten(ctx, *rec.Snapshot)
}

// revertBackend undoes a committed change entirely. Staged: sending back,
// then no longer listening on the new port; the coordinator sends it only
// once no node sends the new port (after a send-only rollback everywhere).
func (m *Machine) revertBackend(ctx context.Context, rec Record) (dataplane.State, error) {
	if !rec.Staged() {
		return m.be.Revert(ctx, *rec.Snapshot)
	}
	st, err := m.stager()
	if err != nil {
		return dataplane.State{}, err
	}
	out, err := st.UnswitchSend(ctx, *rec.Snapshot)
	if err != nil {
		return out, err
	}
	if err := st.Unlisten(ctx, *rec.Snapshot); err != nil {
		return out, err
	}
	return out, nil
}

func (m *Machine) finalizeBackend(ctx context.Context, rec Record) (dataplane.State, error) {
	if !rec.Staged() {
		return dataplane.State{}, m.be.Finalize(ctx, *rec.Snapshot)
	}
	st, err := m.stager()
	if err != nil {
		return dataplane.State{}, err
	}
	out, err := st.Retire(ctx, *rec.Snapshot)
	if err == nil && out.Port != rec.ToPort {
		err = fmt.Errorf("read back port %d after retiring port %d, want %d", out.Port, rec.FromPort, rec.ToPort)
	}
	return out, err
}

// deadmanLocked is the dead-man's undo of a COMMITTED record: the atomic
// flip is reverted; a staged node only switches its sending back.
func (m *Machine) deadmanLocked(rec Record) Record {
	if !rec.Staged() || testFullDeadman {
		return m.revertLocked(rec, ByDeadman)
	}
	return m.unswitchLocked(rec, ByDeadman)
}

// unswitchLocked switches a staged node's sending back to the old port:
// PREPARED (listening on both), or FAILED when that fails.
func (m *Machine) unswitchLocked(rec Record, by string) Record {
	m.disarmLocked()
	ctx, cancel := context.WithTimeout(context.Background(), m.callTimeout)
	defer cancel()
	var st dataplane.State
	s, err := m.stager()
	if err == nil {
		st, err = s.UnswitchSend(ctx, *rec.Snapshot)
	}
	now := m.clock.Now()
	rec.Updated, rec.RevertedBy = now, by
	if err != nil {
		rec.Phase, rec.Ended = PhaseFailed, now
		rec.Error = joinErr(rec.Error, "switch sending back: "+err.Error())
		m.log.Error("switching sending back failed: operator needed", "operation", rec.ID, "by", by, "err", err)
	} else {
		rec.Phase = PhasePrepared
		rec.Deadline = time.Time{}
		rec.CurrentPort = st.Port
		rec.Error = joinErr(rec.Error, fmt.Sprintf("sending switched back to port %d by %s; still listening on %d and %d", rec.FromPort, by, rec.FromPort, rec.ToPort))
		m.obs.PortObserved(st.Port)
		if by == ByDeadman {
			m.obs.DeadmanReverted()
		}
		m.log.Warn("staged: sending switched back, still listening on both", "operation", rec.ID, "by", by)
	}
	m.saveBestEffort(&rec)
	m.setLocked(rec)
	return rec
}

// unswitchRequestLocked is a send-only Rollback.
func (m *Machine) unswitchRequestLocked(id string, cur *Record, reason string) (Record, error) {
	if cur == nil || cur.ID != id {
		if err := m.refuseIfBusyLocked(id); err != nil {
			return Record{}, err
		}
		return Record{}, errf(CodeNotFound, nil, "operation %s unknown: nothing to switch back", id)
	}
	if !cur.Staged() {
		return *cur, errf(CodeInvalidArgument, nil, "send_only rollback of operation %s: it is an atomic operation (send_only is for staged ones)", id)
	}
	switch cur.Phase {
	case PhaseCommitted, PhaseConfirmed:
		out := m.unswitchLocked(*cur, ByRollback)
		if out.Phase == PhaseFailed {
			return out, errf(CodeInternal, nil, "operation %s: %s", id, out.Error)
		}
		m.log.Info("staged: send-only rollback", "operation", id, "reason", reason)
		return out, nil
	case PhaseFinalized:
		return *cur, errf(CodeFailedPrecondition, nil,
			"operation %s is FINALIZED (port %d retired): run a new operation to change the port back", id, cur.FromPort)
	}
	return *cur, nil // PREPARING/PREPARED (not switched), or already undone
}

// relistenRetry is how often a staged node that could not listen on both
// ports again after a restart tries again.
var relistenRetry = 5 * time.Second // a var: the test shortens it

// relistenAfterRestartLocked has a staged node that was listening on both
// ports (PREPARED, or switched: COMMITTED, CONFIRMED) listen again when the
// agent starts, and a switched one send the new port again. After a plain
// agent restart the receiver is still there and both calls change nothing
// (they are idempotent); after the node rebooted, the kernel's second
// device or the OVS receive ports' flows are gone while peers may send the
// new port, and this puts them back. The sending matters as much: the coordinator
// counts a switched node as sending the new port, so once every node does
// it retires the old port, and a node that came back sending the old one
// would be cut off (a lab run lost 17-49 probes each way on such a pair).
// Until it succeeds the agent is not ready (NotReady names the operation
// and why) and tries again every relistenRetry: it cannot stop listening by
// itself either.
func (m *Machine) relistenAfterRestartLocked(ctx context.Context, rec Record) {
	if err := m.relistenLocked(ctx, rec); err != nil {
		m.setRelistenErr(rec, err)
		go m.retryRelisten(rec.ID)
		return
	}
	m.log.Info("staged: listening on both ports again after the restart", "operation", rec.ID, "ports", fmt.Sprintf("%d,%d", rec.FromPort, rec.ToPort))
}

func (m *Machine) relistenLocked(ctx context.Context, rec Record) error {
	st, err := m.stager()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, m.callTimeout)
	defer cancel()
	if err := st.Listen(cctx, *rec.Snapshot); err != nil {
		return err
	}
	if rec.Phase == PhaseCommitted || rec.Phase == PhaseConfirmed {
		if _, err := st.SwitchSend(cctx, *rec.Snapshot); err != nil {
			return fmt.Errorf("send on port %d again: %w", rec.ToPort, err)
		}
	}
	return nil
}

func (m *Machine) setRelistenErr(rec Record, err error) {
	msg := ""
	if err != nil {
		msg = fmt.Sprintf("staged operation %s: not listening on port %d again since the agent restarted (retrying every %s): %v", rec.ID, rec.ToPort, relistenRetry, err)
		m.log.Error("staged: cannot listen on both ports again after the restart", "operation", rec.ID, "err", err)
	}
	m.mu.Lock()
	m.relistenErr = msg
	m.mu.Unlock()
}

// retryRelisten tries relistenLocked again until it succeeds, the machine
// closes, or operation id is no longer a staged one listening.
func (m *Machine) retryRelisten(id string) {
	for {
		time.Sleep(relistenRetry)
		m.lockOp()
		cur := m.current()
		if m.closed || cur == nil || cur.ID != id || !cur.Staged() ||
			(cur.Phase != PhasePrepared && cur.Phase != PhaseCommitted && cur.Phase != PhaseConfirmed) {
			m.opMu.Unlock()
			m.setRelistenErr(Record{}, nil)
			return
		}
		err := m.relistenLocked(context.Background(), *cur)
		m.opMu.Unlock()
		if err == nil {
			m.setRelistenErr(Record{}, nil)
			m.log.Info("staged: listening on both ports again after the restart", "operation", id)
			return
		}
		m.setRelistenErr(*cur, err)
	}
}
