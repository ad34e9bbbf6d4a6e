package barrier

// Resume says where a restarted coordinator picks an operation up.
type Resume int

// Resume points.
const (
	// ResumeAbort: the operation never reached commit: abort it.
	ResumeAbort Resume = iota
	// ResumeVerify: commit was reached and every agent reports committed on
	// the target: verify, confirm and finalize.
	ResumeVerify
	// ResumeRollback: commit was reached but not every agent is committed
	// (or the caller could not tell): roll back.
	ResumeRollback
	// ResumeFinalize (staged only): every batch was confirmed and the old
	// port's retirement had started: finish it.
	ResumeFinalize
)

// ChooseResume is where a restarted coordinator picks an interrupted
// operation up, from its journal record (was Commit sent, which step was in
// flight) and what the agents report now (every target committed on the
// target port). Before commit nothing flipped: abort. An abort or rollback
// in flight is finished. After commit, verify only when every agent is
// committed; anything less, or not knowing, rolls back (an agent that is
// unsure is never left flipped behind a verify that cannot see it).
// Asking the agents only matters after commit and outside an undo: the
// runner asks them only when NeedsAgents says so.
func ChooseResume(commitSent bool, step Step, allCommitted bool) Resume {
	switch {
	case !commitSent:
		return ResumeAbort
	case step == Rollback || step == Abort:
		return ResumeRollback
	case allCommitted:
		return ResumeVerify
	}
	return ResumeRollback
}

// ChooseStagedResume is ChooseResume for a staged operation, where the
// agents' answers do not matter: before any Commit nothing sends the new
// port, so abort (every node stops listening on it); once the old port's
// retirement started, every node was confirmed sending the new port, so
// finish it; anything in between is undone (Unswitch, then Rollback),
// which is safe whatever each node did, where going on would need to know
// which batches really switched.
func ChooseStagedResume(commitSent bool, step Step) Resume {
	switch {
	case !commitSent:
		return ResumeAbort
	case step == Finalize:
		return ResumeFinalize
	}
	return ResumeRollback
}

// NeedsAgents reports whether ChooseResume's answer depends on the agents'
// state for a record with these fields.
func NeedsAgents(commitSent bool, step Step) bool {
	return commitSent && step != Rollback && step != Abort
}

// ResumeAt starts a restarted operation at the given point. Every agent is
// assumed to have been sent Prepare (and, except for ResumeAbort, Commit).
func (o *Op) ResumeAt(r Resume) []Action {
	if o.step != "" {
		return nil
	}
	o.sentPrepare = true
	switch r {
	case ResumeAbort:
		o.reason = "coordinator restarted before commit"
		return o.undo(Abort, o.cfg.Nodes)
	case ResumeVerify:
		o.sentCommit = true
		return o.send(Verify, o.cfg.Nodes)
	case ResumeFinalize:
		o.sentCommit = true
		o.batch = len(o.cfg.Batches) - 1
		return o.send(Finalize, o.cfg.Nodes)
	default:
		o.sentCommit = true
		if o.staged() {
			o.reason = "coordinator restarted while the senders were switching"
			return o.undo(Unswitch, o.cfg.Nodes)
		}
		o.reason = "coordinator restarted after commit and not every agent is committed"
		return o.undo(Rollback, o.cfg.Nodes)
	}
}

// Ended rebuilds an operation that ended in an earlier run (read back from
// a journal) so that a rollback request acts on it as it would have then:
// a Succeeded one is rolled back on every node; any other outcome leaves
// nothing to do.
func (o *Op) Ended(out Outcome, reason string) {
	if o.step != "" {
		return
	}
	o.step, o.outcome, o.reason = Done, out, reason
	if out == Succeeded || out == Held {
		o.sentPrepare, o.sentCommit = true, true
	}
}
