package barrier

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// stage is what the current step waits for.
type stage int

const (
	stageBarrier  stage = iota // the agents' answers (for the first prepare, and the probe reset)
	stageHooks                 // hook calls at hookPoint, one at a time
	stageVerifier              // the operation-wide verifier
	stageProbes                // the probe read before Declare
)

// Op is one operation's state machine. It is not safe for concurrent use.
type Op struct {
	cfg      Config
	step     Step
	attempt  int
	attempts map[Step]int      // monotonic per step, so late replies of an earlier attempt never match
	pending  map[string]Status // this step's agents
	npending int               // how many of them are still StatusPending
	errs     map[string]string // this step's failure messages
	outcome  Outcome
	reason   string // why the operation is aborting, rolling back or failed

	sentPrepare bool // Prepare went out: Rollback targets everyone
	sentCommit  bool // Commit went out: some agent may have flipped
	// guard is set while a required Journal (a Commit's) has been asked
	// for and its Send may not have gone out: a JournalFailed then
	// cancels the send. commitBefore is sentCommit before that send.
	guard        bool
	commitBefore bool
	rollbackReq  string
	tries        int           // attempts of the current abort/rollback so far
	spent        time.Duration // pauses and timed-out attempts of it, a lower bound of the time spent
	failed       bool          // some agent failed (not just finalize)
	unreached    []string

	stage     stage
	waitReset bool      // ResetProbes went out, ProbesReset not back yet
	hookPoint HookPoint // stageHooks: the point being called
	hookQueue []string  // stageHooks: the hooks still to call, the first one in flight
	marks     map[hookKey]HookState
	notes     []string // this run's errors that do not change the outcome
	ending    Outcome  // stageHooks (restore) and stageProbes: the outcome to declare next

	history map[string][]NodeStep // per node, in order

	batch    int  // staged: index of the batch in flight in cfg.Batches
	lastUndo Step // the undo step last started (a retry of a Failed one starts there)
}

// New returns an operation over cfg.Nodes that has not started.
func New(cfg Config) *Op {
	nodes := slices.Clone(cfg.Nodes)
	slices.Sort(nodes)
	cfg.Nodes = slices.Compact(nodes)
	if cfg.RollbackAttempts < 1 {
		cfg.RollbackAttempts = 1
	}
	o := &Op{cfg: cfg, history: map[string][]NodeStep{}, attempts: map[Step]int{}, marks: map[hookKey]HookState{}}
	for _, m := range cfg.HookMarks {
		o.marks[hookKey{m.Hook, m.Point}] = m.State
	}
	return o
}

// Start begins the plan: Prepare to every target, and the probe counters'
// reset alongside.
func (o *Op) Start() []Action {
	if o.step != "" {
		return nil
	}
	if len(o.cfg.Switched) > 0 {
		// Nodes send the new port already: journaled as such from the
		// first step, so that a restart undoes with Unswitch first.
		o.sentCommit = true
	}
	acts := o.send(Prepare, o.cfg.Nodes)
	if o.cfg.Probes {
		// The reset rides in the Prepare: a fan-out less in the round
		// whose length sets the commit lead.
		o.waitReset = true
		s := acts[len(acts)-1].(Send)
		s.ResetProbes = true
		acts[len(acts)-1] = s
		acts = append(acts, ResetProbes{Rode: true})
	}
	return acts
}

// Step feeds one event and returns the actions it causes.
func (o *Op) Step(ev Event) []Action {
	switch e := ev.(type) {
	case Reply:
		st, msg := StatusOK, e.Err
		switch {
		case !e.OK:
			st = StatusFailed
		case e.Step == Commit && o.judgesLate() && e.Lateness > o.cfg.LateBudget:
			st = StatusLate
			msg = fmt.Sprintf("applied %s after the commit instant, past the lateness budget %s", e.Lateness, o.cfg.LateBudget)
		}
		return o.resolve(e.Node, e.Step, e.Attempt, st, msg)
	case Timeout:
		return o.resolve(e.Node, e.Step, e.Attempt, StatusTimeout, "no answer within the step deadline")
	case Late:
		if !o.judgesLate() {
			return nil // the step waits for its answer
		}
		return o.resolve(e.Node, Commit, e.Attempt, StatusLate, "no answer by the commit instant plus the answer deadline")
	case Deadline:
		if e.Step != o.step || e.Attempt != o.attempt {
			return nil
		}
		var acts []Action
		for _, n := range o.pendingNodes() {
			acts = append(acts, o.resolve(n, e.Step, e.Attempt, StatusTimeout, "step deadline passed")...)
		}
		return acts
	case StepFailed:
		if e.Step != o.step || o.outcome != Pending {
			return nil
		}
		o.failed = true
		if o.reason == "" {
			o.reason = fmt.Sprintf("%s failed: %s", e.Step, e.Reason)
		}
		return o.barrierDone()
	case RollbackRequested:
		return o.requestRollback(e.Reason)
	case ProbesReset:
		if !o.waitReset {
			return nil
		}
		o.waitReset = false
		return o.barrierDone()
	case HookDone:
		return o.hookDone(e)
	case Verified:
		if o.stage != stageVerifier {
			return nil
		}
		o.stage = stageBarrier
		if e.Err != "" {
			o.failed = true
			if o.reason == "" {
				o.reason = fmt.Sprintf("%s failed: %s", Verify, e.Err)
			}
		}
		return o.proceed()
	case ProbesRead:
		if o.stage != stageProbes {
			return nil
		}
		o.stage = stageBarrier
		return o.declare(o.ending)
	case JournalFailed:
		return o.journalFailed(e)
	}
	return nil
}

// journalFailed handles a journal write that failed. Before a Commit the
// send did not go out (the Journal was required): nothing flipped, and the
// operation is undone as if the commit had failed on every node, with
// commit_sent as it was. Before any other step the actions went out
// anyway (an undo must never wait on the disk; a Prepare, Verify, Confirm
// or Finalize replays safely after a crash) and the report says what the
// journal missed.
func (o *Op) journalFailed(e JournalFailed) []Action {
	msg := fmt.Sprintf("the journal could not record %s#%d: %s", e.Step, e.Attempt, e.Err)
	if !o.guard || e.Step != o.step || e.Attempt != o.attempt || o.outcome != Pending {
		o.notes = append(o.notes, msg)
		return nil
	}
	o.guard = false
	o.sentCommit = o.commitBefore
	for _, n := range o.pendingNodes() {
		// Never sent: the node's history does not show the step.
		h := o.history[n]
		o.history[n] = h[:len(h)-1]
	}
	o.pending, o.npending = map[string]Status{}, 0
	o.failed = true
	if o.reason == "" {
		o.reason = msg + "; the commit was not sent"
	}
	return o.proceed()
}

// judgesLate: lateness decides here (an atomic operation under the
// rollback policy with a budget). A staged switch has no instant to be
// late for.
func (o *Op) judgesLate() bool {
	return !o.staged() && o.cfg.LateBudget > 0 && !o.cfg.LateWait
}

func (o *Op) requestRollback(reason string) []Action {
	if reason == "" {
		reason = "operator requested rollback"
	}
	switch o.step {
	case "":
		// Never started: nothing to undo.
		o.step, o.outcome, o.reason = Done, Aborted, reason
		return []Action{Declare{Outcome: Aborted, Reason: reason}}
	case Abort, Rollback, Unswitch:
		return nil
	case Done:
		switch o.outcome {
		case Succeeded, Held:
			o.reason = reason
			o.outcome = Pending
			return o.undo(o.rollbackStep(), o.cfg.Nodes)
		case Failed:
			// Retry reaching the nodes the last attempt missed.
			st := Rollback
			if !o.sentCommit {
				st = Abort
			}
			if o.lastUndo == Unswitch {
				st = Unswitch // nobody was unlistened yet
			}
			o.outcome = Pending
			nodes := o.unreached
			o.unreached = nil
			return o.undo(st, nodes)
		}
		return nil
	default:
		if o.rollbackReq == "" {
			o.rollbackReq = reason
		}
		return nil
	}
}

func (o *Op) pendingNodes() []string {
	var ns []string
	for _, n := range o.cfg.Nodes {
		if o.pending[n] == StatusPending {
			ns = append(ns, n)
		}
	}
	return ns
}

func (o *Op) resolve(node string, step Step, attempt int, st Status, msg string) []Action {
	if step != o.step || attempt != o.attempt {
		return nil // late: an earlier step or attempt
	}
	o.guard = false // an answer: the send went out
	cur, ok := o.pending[node]
	if !ok || cur != StatusPending {
		return nil // not a target of this step, or a duplicate
	}
	o.pending[node] = st
	o.npending--
	h := o.history[node]
	h[len(h)-1] = NodeStep{Step: step, Status: st}
	if st != StatusOK {
		o.errs[node] = msg
		h[len(h)-1].Err = msg
	}
	return o.barrierDone()
}

// barrierDone advances when the current step's barrier is complete: every
// agent resolved and, for the first prepare, the probe reset ended.
func (o *Op) barrierDone() []Action {
	// A count, not a scan: at 10,000 agents a scan per answer made each
	// step quadratic (BenchmarkCoordinatorScaleSim).
	if o.stage != stageBarrier || o.waitReset || o.npending > 0 || o.step == Done {
		return nil
	}
	return o.advance()
}

// advance runs when every agent of the current step has resolved.
func (o *Op) advance() []Action {
	var bad []string
	for _, n := range o.cfg.Nodes {
		if s, ok := o.pending[n]; ok && s != StatusOK {
			bad = append(bad, n)
		}
	}
	switch o.step {
	case Prepare, Commit, Verify, Confirm:
		if len(bad) > 0 && o.reason == "" {
			o.reason = fmt.Sprintf("%s failed on %s: %s", o.step, bad[0], o.errs[bad[0]])
			if len(bad) > 1 {
				o.reason += fmt.Sprintf(" (and %d more)", len(bad)-1)
			}
		}
		if len(bad) > 0 {
			o.failed = true
		}
		if o.failed || o.rollbackReq != "" {
			return o.proceed()
		}
		switch o.step {
		case Prepare:
			if o.staged() {
				// The source of truth moves once every node sends the
				// new port (below), never while some node still sends
				// the old one: a CNI that rebuilds a node's device from
				// it (flanneld restarting, Felix reconciling) would
				// move that node off the old port while peers send it.
				return o.proceed()
			}
			return o.callHooks(HookBeforeCommit)
		case Verify:
			if o.cfg.Verifier {
				o.stage = stageVerifier
				return []Action{RunVerifier{Nodes: slices.Clone(o.cfg.Nodes), Timeout: o.cfg.StepTimeout, Batch: o.batchNumber(Verify)}}
			}
		case Confirm:
			if o.staged() && o.batch < len(o.cfg.Batches)-1 {
				o.batch++
				return o.send(Commit, o.cfg.Batches[o.batch])
			}
			if o.holds() {
				// Some nodes still send the old port: every node keeps
				// listening on both until a later run switches them.
				return o.finish(Held)
			}
			if o.staged() {
				// Every node sends the new port: now the source of
				// truth may say so, then AfterConfirm, then retire.
				return o.callHooks(HookBeforeCommit)
			}
			return o.callHooks(HookAfterConfirm)
		}
		return o.proceed()
	case Finalize:
		if o.rollbackReq != "" && !o.staged() {
			return o.succeed()
		}
		return o.callHooks(HookFinalize)
	case Abort, Rollback, Unswitch:
		if len(bad) == 0 && o.step == Unswitch {
			// No node sends the new port any more: now they may stop
			// listening on it.
			return o.undo(Rollback, o.cfg.Nodes)
		}
		if len(bad) == 0 {
			o.ending = Aborted
			if o.step == Rollback {
				o.ending = RolledBack
			}
			o.unreached = nil
			return o.callHooks(HookRestore)
		}
		return o.retry(bad)
	}
	return nil
}

// proceed moves on from a step of the plan whose barrier, and whatever ran
// after it (hooks, the verifier), completed: to the next step, or to an
// abort or rollback when something failed or the operator asked.
func (o *Op) proceed() []Action {
	if o.failed || o.rollbackReq != "" {
		if o.reason == "" {
			o.reason = o.rollbackReq
		}
		if o.sentCommit {
			return o.undo(o.rollbackStep(), o.cfg.Nodes)
		}
		return o.undo(Abort, o.cfg.Nodes)
	}
	next := map[Step]Step{Prepare: Commit, Commit: Verify, Verify: Confirm, Confirm: Finalize}[o.step]
	if o.staged() && next != Finalize {
		return o.send(next, o.cfg.Batches[o.batch])
	}
	return o.send(next, o.cfg.Nodes)
}

// succeed ends a finalized operation, unless a rollback was asked
// meanwhile: the change is complete; undo it now.
func (o *Op) succeed() []Action {
	if o.rollbackReq != "" && o.staged() {
		// The old port is retired on every node: no node can switch
		// back any more. Undoing it is a new staged operation the other
		// way, which the operator starts by rolling back the finished one.
		o.notes = append(o.notes, "rollback requested ("+o.rollbackReq+") after the old port's retirement began: the change completed; roll back the finished operation to reverse it (a staged operation back to the old port)")
		o.rollbackReq = ""
		return o.finish(Succeeded)
	}
	if o.rollbackReq != "" {
		o.reason = o.rollbackReq
		o.rollbackReq = ""
		return o.undo(o.rollbackStep(), o.cfg.Nodes)
	}
	return o.finish(Succeeded)
}

// finish ends the operation with out: after the probe read when Commit
// went out (nodes may have flipped: the report shows the disruption
// whatever the outcome), then Declare.
func (o *Op) finish(out Outcome) []Action {
	if o.cfg.Probes && o.sentCommit {
		o.stage, o.ending = stageProbes, out
		return []Action{ReadProbes{}}
	}
	return o.declare(out)
}

func (o *Op) declare(out Outcome) []Action {
	if out == Succeeded && o.rollbackReq != "" {
		return o.succeed() // asked during the probe read
	}
	o.step, o.outcome = Done, out
	d := Declare{Outcome: out, Reason: o.reason, Notes: o.notes}
	if out == Succeeded {
		d.Reason = ""
	}
	if out == Failed {
		d.Unreached = slices.Clone(o.unreached)
	}
	o.notes = nil
	return []Action{d}
}

// send starts step on nodes: journaled first, then sent.
func (o *Op) send(step Step, nodes []string) []Action {
	o.attempts[step]++
	o.step, o.attempt, o.stage = step, o.attempts[step], stageBarrier
	o.guard = false
	switch step {
	case Prepare:
		o.sentPrepare = true
	case Commit:
		o.guard, o.commitBefore = true, o.sentCommit
		o.sentCommit = true
	}
	o.pending = make(map[string]Status, len(nodes))
	o.npending = len(nodes)
	o.errs = map[string]string{}
	for _, n := range nodes {
		o.pending[n] = StatusPending
		o.history[n] = append(o.history[n], NodeStep{Step: step, Status: StatusPending})
	}
	b := o.batchNumber(step)
	return []Action{
		Journal{Step: step, Attempt: o.attempt, CommitSent: o.sentCommit, Batch: b, Required: step == Commit},
		Send{Step: step, Attempt: o.attempt, Nodes: slices.Clone(nodes), Timeout: o.cfg.StepTimeout, Batch: b},
	}
}

// Tries is how many attempts the current (or last) abort or rollback made.
func (o *Op) Tries() int { return o.tries }

// Phase is the step in flight (Done when terminal, "" before Start).
func (o *Op) Phase() Step { return o.step }

// Attempt is the current step's attempt number.
func (o *Op) Attempt() int { return o.attempt }

// Outcome is Pending until a Declare was emitted.
func (o *Op) Outcome() Outcome { return o.outcome }

// Reason explains an abort, rollback or failure.
func (o *Op) Reason() string { return o.reason }

// CommitSent reports whether Commit went out: from then on an agent may
// have flipped and undoing is a rollback, not an abort.
func (o *Op) CommitSent() bool { return o.sentCommit }

// Unreached names the agents a failed abort or rollback did not reach.
func (o *Op) Unreached() []string { return slices.Clone(o.unreached) }

// Nodes returns the targets, sorted.
func (o *Op) Nodes() []string { return slices.Clone(o.cfg.Nodes) }

// History returns what node did, step by step.
func (o *Op) History(node string) []NodeStep { return slices.Clone(o.history[node]) }

// String dumps the state canonically (for golden files and logs).
func (o *Op) String() string {
	var b strings.Builder
	step := o.step
	if step == "" {
		step = "new"
	}
	fmt.Fprintf(&b, "step=%s#%d outcome=%s commit-sent=%t", step, o.attempt, o.outcome, o.sentCommit)
	if o.staged() {
		fmt.Fprintf(&b, " batch=%d/%d", o.batch+1, len(o.cfg.Batches))
	}
	if o.reason != "" {
		fmt.Fprintf(&b, " reason=%q", o.reason)
	}
	if len(o.unreached) > 0 {
		fmt.Fprintf(&b, " unreached=%s", strings.Join(o.unreached, ","))
	}
	switch {
	case o.stage == stageHooks:
		fmt.Fprintf(&b, " waiting=hook:%s:%s", o.hookQueue[0], o.hookPoint)
	case o.stage == stageVerifier:
		b.WriteString(" waiting=verifier")
	case o.stage == stageProbes:
		b.WriteString(" waiting=probe-read")
	case o.waitReset:
		b.WriteString(" waiting=probe-reset")
	}
	for _, n := range o.cfg.Nodes {
		fmt.Fprintf(&b, "\n  %s:", n)
		for _, h := range o.history[n] {
			fmt.Fprintf(&b, " %s=%s", h.Step, h.Status)
		}
	}
	for _, h := range o.cfg.Hooks {
		fmt.Fprintf(&b, "\n  hook %s:", h)
		for _, p := range []HookPoint{HookBeforeCommit, HookAfterConfirm, HookFinalize, HookRestore} {
			if st := o.marks[hookKey{h, p}]; st != "" {
				fmt.Fprintf(&b, " %s=%s", p, st)
			}
		}
	}
	return b.String()
}
