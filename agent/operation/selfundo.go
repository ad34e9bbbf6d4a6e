package operation

import (
	"context"
	"fmt"
	"time"
)

// What the machine undoes by itself, without the coordinator: the
// dead-man timer that reverts a commit nobody confirmed, the prepare
// timeout that aborts a prepared operation nobody committed, and the
// abort and revert both of them (and the coordinator's calls) share.

func (m *Machine) deadmanFired(gen uint64) {
	m.lockOp()
	defer m.opMu.Unlock()
	if m.closed || gen != m.gen {
		return // confirmed, rolled back or re-armed meanwhile
	}
	cur := m.current()
	if cur == nil || cur.Phase != PhaseCommitted {
		return
	}
	m.log.Warn("dead-man deadline reached without confirm: reverting", "operation", cur.ID, "deadline", cur.Deadline)
	m.deadmanLocked(*cur)
}

func (m *Machine) prepareTimedOut(gen uint64) {
	m.lockOp()
	defer m.opMu.Unlock()
	if m.closed || gen != m.gen {
		return
	}
	cur := m.current()
	if cur == nil || cur.Phase != PhasePrepared {
		return
	}
	m.log.Warn("prepared operation neither committed nor rolled back in time: aborting", "operation", cur.ID, "timeout", m.prepareTimeout)
	m.abortLocked(context.Background(), *cur, ByPrepareTimeout,
		fmt.Sprintf("no commit or rollback within the prepare timeout %s", m.prepareTimeout))
}

// armLocked arms the one timer for the current generation.
func (m *Machine) armLocked(d time.Duration, f func(gen uint64)) {
	m.disarmLocked()
	gen := m.gen
	m.timer = m.clock.AfterFunc(d, func() { f(gen) })
}

func (m *Machine) disarmLocked() {
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
}

// --- transitions that undo ---

// abortLocked undoes a prepare: ABORTED, or FAILED when Abort fails.
func (m *Machine) abortLocked(ctx context.Context, rec Record, by, why string) Record {
	m.disarmLocked()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.callTimeout)
	defer cancel()
	now := m.clock.Now()
	rec.Updated, rec.Ended, rec.RevertedBy = now, now, by
	if err := m.abortBackend(actx, rec); err != nil {
		rec.Phase = PhaseFailed
		rec.Error = joinErr(why, "abort: "+err.Error())
		m.log.Error("abort failed: operator needed", "operation", rec.ID, "err", rec.Error)
	} else {
		rec.Phase = PhaseAborted
		rec.Error = why
	}
	m.saveBestEffort(&rec)
	m.setLocked(rec)
	return rec
}

// revertLocked puts the prior port back: REVERTED, or FAILED when Revert
// fails.
func (m *Machine) revertLocked(rec Record, by string) Record {
	m.disarmLocked()
	ctx, cancel := context.WithTimeout(context.Background(), m.callTimeout)
	defer cancel()
	st, err := m.revertBackend(ctx, rec)
	now := m.clock.Now()
	rec.Updated, rec.Ended, rec.RevertedBy = now, now, by
	if err != nil {
		rec.Phase = PhaseFailed
		rec.Error = joinErr(rec.Error, "revert: "+err.Error())
		m.log.Error("revert failed: operator needed", "operation", rec.ID, "by", by, "err", err)
	} else {
		rec.Phase = PhaseReverted
		rec.CurrentPort = st.Port
		m.obs.PortObserved(st.Port)
		if by == ByDeadman {
			m.obs.DeadmanReverted()
		}
	}
	m.saveBestEffort(&rec)
	m.setLocked(rec)
	return rec
}
