package operation

import "time"

// The record's bookkeeping: persisting a transition, the current record,
// refusing a second operation, and the small formatters the records use.

// saveBestEffort persists a transition that has already happened in the
// dataplane; a failure is logged and noted in the record. The previous
// record on disk is then stale but safe: replaying it after a restart
// repeats an idempotent undo.
func (m *Machine) saveBestEffort(rec *Record) {
	if err := m.store.Save(*rec); err != nil {
		m.log.Error("could not persist operation record", "operation", rec.ID, "phase", rec.Phase, "err", err)
		rec.Error = joinErr(rec.Error, "not persisted: "+err.Error())
	}
}

// --- helpers ---

func (m *Machine) current() *Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec == nil {
		return nil
	}
	r := *m.rec
	return &r
}

func (m *Machine) setLocked(rec Record) {
	m.gen++
	m.mu.Lock()
	m.rec = &rec
	m.mu.Unlock()
	m.obs.PhaseChanged(rec.Phase)
}

// refuseIfBusyLocked fails when an operation other than id is in flight.
func (m *Machine) refuseIfBusyLocked(id string) error {
	cur := m.current()
	if cur != nil && cur.ID != id && cur.Phase.InFlight() {
		return errf(CodeFailedPrecondition, nil,
			"operation %s is in flight on this agent (%s, port %d -> %d); finish or roll it back before %s",
			cur.ID, cur.Phase, cur.FromPort, cur.ToPort, id)
	}
	return nil
}

// sameOpLocked returns the record of id, or why a call for id is refused.
func (m *Machine) sameOpLocked(id string) (Record, error) {
	cur := m.current()
	if cur != nil && cur.ID == id {
		return *cur, nil
	}
	if err := m.refuseIfBusyLocked(id); err != nil {
		return Record{}, err
	}
	if cur == nil {
		return Record{}, errf(CodeNotFound, nil, "operation %s unknown: this agent has run no operation (prepare it first)", id)
	}
	return Record{}, errf(CodeNotFound, nil, "operation %s unknown: the last operation on this agent is %s (%s)", id, cur.ID, cur.Phase)
}

func (m *Machine) endedErr(cur Record, step string) error {
	switch cur.Phase {
	case PhaseReverted:
		return errf(CodeFailedPrecondition, nil, "cannot %s operation %s: already reverted by %s at %s", step, cur.ID, cur.RevertedBy, stamp(cur.Ended))
	case PhaseAborted:
		return errf(CodeFailedPrecondition, nil, "cannot %s operation %s: already aborted (%s) at %s", step, cur.ID, cur.Error, stamp(cur.Ended))
	case PhaseFailed:
		return errf(CodeFailedPrecondition, nil, "cannot %s operation %s: it FAILED (%s); roll it back or repair the node", step, cur.ID, cur.Error)
	}
	return errf(CodeFailedPrecondition, nil, "cannot %s operation %s in phase %s", step, cur.ID, cur.Phase)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
