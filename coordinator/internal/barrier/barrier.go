// Package barrier is the coordinator's planning and barrier core: a
// deterministic state machine that decides, for one operation, which step
// to send to which agents next and what the outcome is.
//
// It is fed events (an agent answered ok or failed for a step, a call timed
// out, a step's deadline passed, the operator asked for a rollback) and
// returns actions (send step S to agents X within D, declare the outcome).
// It is modelled on etcd-io/raft's Step/quorum: it owns no sockets, reads
// no clock and starts no goroutines, so every interleaving can be replayed
// from a script (testdata/*.txt) and explored at random.
//
// The plan of an operation is prepare → commit → verify → confirm →
// finalize. Preflight is read-only and runs before an operation exists (a
// failed preflight leaves no operation behind), so it is not a step here.
//
// Rules the machine enforces:
//
//   - A step is a barrier: it completes only when every agent sent that
//     step has answered or timed out. Only then does the machine move on,
//     abort or roll back, so a Rollback never overtakes a Prepare or Commit
//     still in flight to the same agent.
//   - I2: Commit is sent only after every target answered Prepare ok.
//   - Any prepare failure or timeout → abort: Rollback to every agent that
//     was sent Prepare (a failed or timed-out prepare may have done part
//     of its work; Rollback is idempotent on the agent). Nothing flipped.
//   - Any commit, verify or confirm failure or timeout → rollback: Rollback
//     to every agent that was sent Prepare, which includes every agent that
//     may have committed (a commit that timed out may have applied).
//   - Lateness is judged by when a node applied, never by when its answer
//     arrived (an answer leaves after the apply, and at N = 32 the answers
//     of nodes that applied within 11 ms of the instant came ~600 ms after
//     it in the lab). With Config.LateBudget set, a Commit answer that
//     applied more than the budget after the instant (Reply.Lateness, what
//     the node reported, converted to the coordinator's clock, less the
//     clock offset's error bound) is status late: once the others
//     answered, everyone is rolled back. The answer has its own, longer
//     deadline: a node with no answer by then (Late) is resolved at once,
//     status late, like a commit timeout, and everyone is rolled back, the
//     silent node too. The rollback to it may overtake its Commit still in
//     flight; the agent serialises the two, and one that wakes past the
//     budget applies nothing (and one that did apply is reverted by the
//     rollback). This bounds the split to about the answer deadline
//     instead of however long the node was away (docs/faults.md, "Late
//     commits"). The runner sets LateBudget and feeds Late only under the
//     rollback policy; under the wait policy it only reports the node.
//   - Finalize failures do not change the outcome (the change is confirmed
//     everywhere; only the old port's firewall rules remain) but are
//     recorded per node.
//   - An abort or rollback that cannot reach everyone is retried, only to
//     the agents not yet reached, with back-off: the retry's Send carries
//     After, a pause that starts at Config.RetryBackoff and doubles up to
//     Config.RetryBackoffMax. It is retried at least RollbackAttempts
//     times in all and until the pauses and the calls that timed out add
//     up to Config.RetryFor, then the outcome is Failed, naming the
//     unreached nodes. An agent that is merely restarting is reached by a
//     later attempt instead of failing the operation; the caller sets
//     RetryFor to cover the agents' dead-man, by the end of which an agent
//     that stayed unreachable has reverted by itself (I4). The core keeps
//     no clock: it adds up the pauses it asked for and one StepTimeout per
//     attempt that timed out, a lower bound of the time really spent.
//   - Duplicate replies, replies for an earlier step or attempt, and
//     replies after a timeout change nothing.
//   - An operator's rollback request takes effect at the next barrier, or
//     once the hook calls or the verifier in progress ended: asked during
//     BeforeCommit it aborts instead of committing; asked during the
//     Finalize hooks or the probe read it rolls the finished change back
//     instead of declaring success.
//
// What the application does around the agents' steps is ordered here too
// (etcd-io/raft's Ready: the runner performs actions and feeds back
// events, and holds no policy of its own):
//
//   - Journal comes before every Send: after a crash the record never
//     claims less than what the agents may have seen (commit-sent above
//     all).
//   - ResetProbes goes out alongside the first Prepare (not before it: a
//     frozen agent must not hold up everyone's Prepare), and the prepare
//     barrier completes only once ProbesReset came back, so Commit never
//     overtakes a reset.
//   - Once every agent is prepared, the hooks' BeforeCommit calls are made
//     one at a time, in order, each only once journaled as started; the
//     first failure stops the others and aborts (nothing has flipped).
//     Commit goes out only after every one succeeded.
//   - Once every read-back passed, the operation-wide verifier runs
//     (RunVerifier); its failure rolls back.
//   - Once every agent confirmed, the hooks' AfterConfirm calls are made,
//     all of them, before Finalize is sent; once every agent finalized,
//     the hooks' Finalize calls are made before success is declared.
//     Their errors are recorded (Declare.Notes); the outcome stands.
//   - When an abort or rollback reached everyone, Restore is called, in
//     reverse order, on every hook whose BeforeCommit was started (it may
//     have acted even if it failed), before the outcome is declared;
//     its errors are recorded, the outcome stands.
//   - When an operation that sent Commit ends, whatever its outcome, the
//     probe counters are read (ReadProbes) before Declare.
//   - A resumed operation gets the hook calls journaled so far
//     (Config.HookMarks): a BeforeCommit once started is never made again
//     (it is restored instead), an AfterConfirm or Finalize that a restart
//     interrupted is made again, one that finished is not, and Restore is
//     made until it succeeds.
//   - Where a restarted coordinator picks an operation up is decided here
//     too (ChooseResume): abort before commit, finish an undo in flight,
//     verify after commit only when every agent says it is committed,
//     else roll back. The runner only gathers the agents' answers, and
//     only when NeedsAgents says they matter.
//
// This package must not do I/O, read clocks or know about gRPC.
package barrier

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Step is one step of an operation's plan.
type Step string

// The steps. Abort and Rollback both send the agent Rollback RPC; they are
// distinct steps because they lead to distinct outcomes.
const (
	Prepare  Step = "prepare"
	Commit   Step = "commit"
	Verify   Step = "verify"
	Confirm  Step = "confirm"
	Finalize Step = "finalize"
	Abort    Step = "abort"
	Rollback Step = "rollback"
	// Unswitch is the staged strategy's first undo step: every node
	// switches its sending back to the old port and keeps listening on
	// both; only once every node answered does Rollback go out (which
	// stops them listening), so no node stops receiving a port a peer may
	// still send on.
	Unswitch Step = "unswitch"
	Done     Step = "done" // terminal: no step in flight
)

// Outcome is the result of an operation.
type Outcome int

// Outcomes. Failed means an abort or rollback could not reach every agent:
// an operator is needed, and Unreached names the nodes.
const (
	Pending Outcome = iota
	Succeeded
	Aborted
	RolledBack
	Failed
	// Held: a staged operation over a subset switched its batches and
	// stopped there; every node listens on both ports, the nodes outside
	// the batches (and outside Switched) still send the old one. A later
	// run of the same operation switches them (Config.Switched), or a
	// rollback undoes it all.
	Held
)

func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case Succeeded:
		return "succeeded"
	case Aborted:
		return "aborted"
	case RolledBack:
		return "rolled-back"
	case Failed:
		return "failed"
	case Held:
		return "held"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Config describes one operation.
type Config struct {
	Nodes []string // the target agents, by node name
	// StepTimeout is handed out with every Send as a relative deadline; the
	// caller enforces it (the core has no clock).
	StepTimeout time.Duration
	// RollbackAttempts is how many times, at least, an abort or rollback is
	// sent to an agent that did not acknowledge it before the outcome is
	// Failed.
	RollbackAttempts int
	// RetryBackoff is the pause before the second attempt of an abort or
	// rollback; every further pause doubles, up to RetryBackoffMax (when
	// set). 0: retries go out at once.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// RetryFor is how long, at least, an abort or rollback keeps trying an
	// unreached agent (pauses plus attempts that timed out) before the
	// outcome is Failed. 0, or no RetryBackoff (nothing would make the
	// time add up): RollbackAttempts alone decides.
	RetryFor time.Duration

	// Hooks names the application's hooks, in the order they are called
	// (Restore in reverse). HookMarks are the hook calls already journaled
	// by an earlier run of the operation (a resumed one).
	Hooks     []string
	HookMarks []HookMark
	// Verifier: an operation-wide check runs after the read-back.
	Verifier bool
	// Probes: the agents keep probe mesh counters, reset alongside
	// Prepare and read when an operation that sent Commit ends.
	Probes bool
	// LateBudget: a Commit answer whose Lateness exceeds it is late (the
	// operation rolls back). 0: lateness is not judged here.
	LateBudget time.Duration
	// Batches, when set, make the operation staged (make-before-break):
	// Prepare (listen on both ports) goes to every node, then Commit
	// (switch sending), Verify and Confirm go batch by batch, in order,
	// with the verifier run over every node after each batch; Finalize
	// (retire the old port) goes to every node once the last batch is
	// confirmed. Every node must be in exactly one batch. Any failure
	// after the first Commit undoes with Unswitch to every node, then
	// Rollback. A node may be in no batch (a subset): the operation is
	// then Held after the last batch instead of finalized.
	Batches [][]string
	// Switched (staged) are the nodes an earlier run of this operation
	// switched and confirmed: it was Held, and this run switches the
	// batches' nodes on top. Prepare still goes to every node (the agents
	// answer it as a replay), and from the start an undo switches every
	// node's sending back first, as after a Commit.
	Switched []string
}

// HookPoint is where in the plan a hook is called.
type HookPoint string

// The hook points, as the journal names them.
const (
	HookBeforeCommit HookPoint = "before-commit"
	HookAfterConfirm HookPoint = "after-confirm"
	HookFinalize     HookPoint = "finalize"
	HookRestore      HookPoint = "restore"
)

// HookState is the journaled state of one hook call.
type HookState string

// Hook call states. Started is journaled before the call: it may have
// acted.
const (
	MarkStarted HookState = "started"
	MarkDone    HookState = "done"
	MarkFailed  HookState = "failed"
)

// HookMark is the journaled state of hook Hook at Point.
type HookMark struct {
	Hook  string
	Point HookPoint
	State HookState
}

type hookKey struct {
	hook  string
	point HookPoint
}

// due says whether a hook call at point must be made given its journaled
// state. BeforeCommit is never repeated: once started it may have acted,
// and the operation is undone (Restore) instead. AfterConfirm and Finalize
// run after the dataplane is verified good: one that a restart
// interrupted (started, never finished) is made again, so the source of
// truth converges; one that finished (done or failed) is not. Restore is
// made again until it succeeds (it puts a state back: repeating it is
// harmless, skipping it is not).
func due(point HookPoint, state HookState) bool {
	switch point {
	case HookBeforeCommit:
		return state == ""
	case HookAfterConfirm, HookFinalize:
		return state == "" || state == MarkStarted
	default: // restore
		return state != MarkDone
	}
}

// Event is something that happened, fed to Op.Step.
type Event interface{ isEvent() }

// Reply is an agent's answer to a step.
type Reply struct {
	Node    string
	Step    Step
	Attempt int // the Send.Attempt it answers
	OK      bool
	Err     string // why not OK
	// Lateness (an OK Commit of an atomic operation only) is how long
	// after the commit instant the node applied, by its own report in the
	// coordinator's clock, less the clock offset's error bound: the least
	// it can have been. Judged against Config.LateBudget.
	Lateness time.Duration
}

// Timeout is a single call that got no answer within its deadline.
type Timeout struct {
	Node    string
	Step    Step
	Attempt int
}

// Deadline is the whole step's deadline passing: every agent that has not
// answered counts as timed out.
type Deadline struct {
	Step    Step
	Attempt int
}

// Late is a node whose Commit answer had not arrived by the commit instant
// plus the answer deadline: roll back rather than wait for it (if it did
// not apply, the overlay is split while it is away).
type Late struct {
	Node    string
	Attempt int // the Commit attempt
}

// StepFailed is an operation-wide failure of a step (the probe mesh said
// the overlay is broken, say), not attributable to one agent.
type StepFailed struct {
	Step   Step
	Reason string
}

// RollbackRequested is the operator asking to put everything back.
type RollbackRequested struct{ Reason string }

// HookDone is the end of a CallHook. Err is empty when the hook succeeded,
// else the message to record (it names the hook and the point).
type HookDone struct {
	Hook  string
	Point HookPoint
	Err   string
}

// Verified is the end of RunVerifier; Err is empty when it passed.
type Verified struct{ Err string }

// ProbesReset is the end of ResetProbes (whether every agent answered or
// not: the counters are figures for the report, never a reason to stop).
type ProbesReset struct{}

// ProbesRead is the end of ReadProbes.
type ProbesRead struct{}

func (Reply) isEvent()             {}
func (Timeout) isEvent()           {}
func (Late) isEvent()              {}
func (Deadline) isEvent()          {}
func (StepFailed) isEvent()        {}
func (RollbackRequested) isEvent() {}
func (HookDone) isEvent()          {}
func (Verified) isEvent()          {}
func (ProbesReset) isEvent()       {}
func (ProbesRead) isEvent()        {}

// Action is something the caller must do.
type Action interface{ isAction() }

// Send asks the caller to send Step to Nodes in parallel, each call within
// Timeout, and to feed back one Reply or Timeout per node. After, when not
// zero, asks the caller to wait that long first (a retry's back-off): the
// core has no clock, the caller schedules it.
type Send struct {
	Step    Step
	Attempt int
	Nodes   []string
	Timeout time.Duration
	After   time.Duration
	// Batch is the staged batch (1-based) a Commit, Verify or Confirm is
	// for; 0 otherwise.
	Batch int
}

// Declare announces the final outcome. Unreached is set when Outcome is
// Failed. Notes are errors of this run that did not change the outcome
// (hooks after the change was confirmed, a Restore that failed).
type Declare struct {
	Outcome   Outcome
	Reason    string
	Unreached []string
	Notes     []string
}

// Journal asks the caller to persist the operation durably (the step
// about to be sent, and whether Commit went out) before it performs the
// actions that follow.
type Journal struct {
	Step       Step
	Attempt    int
	CommitSent bool
	Batch      int // as Send.Batch
}

// CallHook asks the caller to call one hook at one point, within Timeout,
// journaling the call as started before it and done or failed after it,
// then to feed back HookDone. JournalFirst: if the started mark cannot be
// journaled, do not call the hook and feed back HookDone with that error
// (after a crash nobody would know to Restore what it did).
type CallHook struct {
	Hook         string
	Point        HookPoint
	Timeout      time.Duration
	JournalFirst bool
}

// RunVerifier asks the caller to run the operation-wide verifier over
// Nodes within Timeout and feed back Verified.
type RunVerifier struct {
	Nodes   []string
	Timeout time.Duration
	Batch   int // the staged batch just switched (1-based); 0 otherwise
}

// ResetProbes asks the caller to zero every agent's probe counters and
// feed back ProbesReset.
type ResetProbes struct{}

// ReadProbes asks the caller to read every agent's probe counters into the
// report and feed back ProbesRead.
type ReadProbes struct{}

func (Send) isAction()        {}
func (Declare) isAction()     {}
func (Journal) isAction()     {}
func (CallHook) isAction()    {}
func (RunVerifier) isAction() {}
func (ResetProbes) isAction() {}
func (ReadProbes) isAction()  {}

func (j Journal) String() string {
	if j.Batch > 0 {
		return fmt.Sprintf("journal %s#%d batch=%d commit-sent=%t", j.Step, j.Attempt, j.Batch, j.CommitSent)
	}
	return fmt.Sprintf("journal %s#%d commit-sent=%t", j.Step, j.Attempt, j.CommitSent)
}

func (h CallHook) String() string {
	s := fmt.Sprintf("call-hook %s %s within %s", h.Hook, h.Point, h.Timeout)
	if h.JournalFirst {
		s += " (only once journaled)"
	}
	return s
}

func (v RunVerifier) String() string {
	return fmt.Sprintf("run-verifier on %s within %s", strings.Join(v.Nodes, ","), v.Timeout)
}

func (ResetProbes) String() string { return "reset-probes" }
func (ReadProbes) String() string  { return "read-probes" }

func (s Send) String() string {
	str := fmt.Sprintf("send %s#%d to %s within %s", s.Step, s.Attempt, strings.Join(s.Nodes, ","), s.Timeout)
	if s.Batch > 0 {
		str += fmt.Sprintf(" batch %d", s.Batch)
	}
	if s.After > 0 {
		str += " after " + s.After.String()
	}
	return str
}

func (d Declare) String() string {
	s := "declare " + d.Outcome.String()
	if d.Reason != "" {
		s += fmt.Sprintf(" reason=%q", d.Reason)
	}
	if len(d.Unreached) > 0 {
		s += " unreached=" + strings.Join(d.Unreached, ",")
	}
	for _, n := range d.Notes {
		s += fmt.Sprintf(" note=%q", n)
	}
	return s
}

// Status of one agent in one step.
type Status string

// Per-step statuses of an agent.
const (
	StatusPending Status = "pending"
	StatusOK      Status = "ok"
	StatusFailed  Status = "failed"
	StatusTimeout Status = "timeout"
	StatusLate    Status = "late" // Commit applied past the budget, or not answered by the answer deadline
)

// NodeStep is what one agent did in one step.
type NodeStep struct {
	Step   Step
	Status Status
	Err    string
}

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
	rollbackReq string
	tries       int           // attempts of the current abort/rollback so far
	spent       time.Duration // pauses and timed-out attempts of it, a lower bound of the time spent
	failed      bool          // some agent failed (not just finalize)
	unreached   []string

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
		o.waitReset = true
		acts = append(acts, ResetProbes{})
	}
	return acts
}

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

// Step feeds one event and returns the actions it causes.
func (o *Op) Step(ev Event) []Action {
	switch e := ev.(type) {
	case Reply:
		st, msg := StatusOK, e.Err
		switch {
		case !e.OK:
			st = StatusFailed
		case e.Step == Commit && !o.staged() && o.cfg.LateBudget > 0 && e.Lateness > o.cfg.LateBudget:
			st = StatusLate
			msg = fmt.Sprintf("applied %s after the commit instant, past the lateness budget %s", e.Lateness, o.cfg.LateBudget)
		}
		return o.resolve(e.Node, e.Step, e.Attempt, st, msg)
	case Timeout:
		return o.resolve(e.Node, e.Step, e.Attempt, StatusTimeout, "no answer within the step deadline")
	case Late:
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
	}
	return nil
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
		timedOut := false
		for _, n := range bad {
			timedOut = timedOut || o.pending[n] == StatusTimeout
		}
		if timedOut {
			o.spent += o.cfg.StepTimeout
		}
		if o.tries < o.cfg.RollbackAttempts || (o.cfg.RetryBackoff > 0 && o.spent < o.cfg.RetryFor) {
			pause := o.backoff()
			if o.tries >= o.cfg.RollbackAttempts && o.cfg.RetryFor > 0 {
				// Past the minimum count only to cover RetryFor: the last
				// pause ends just there, not a doubling beyond it.
				pause = min(pause, o.cfg.RetryFor-o.spent)
			}
			o.spent += pause
			o.tries++
			acts := o.send(o.step, bad)
			return withAfter(acts, pause)
		}
		o.unreached = bad
		return o.finish(Failed)
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

// testNoUnswitch is the bite switch of TestStagedInvariantBites: staged
// operations roll back without switching every sender back first.
var testNoUnswitch bool

// testNoHold is the bite switch of TestStagedSubsetBites: a subset's run
// retires the old port instead of holding.
var testNoHold bool

// staged reports whether the operation switches its senders in batches.
func (o *Op) staged() bool { return len(o.cfg.Batches) > 0 }

// holds reports whether a staged operation leaves some node sending the
// old port once its batches are confirmed: a node in no batch and not
// Switched by an earlier run.
func (o *Op) holds() bool {
	if !o.staged() || testNoHold {
		return false
	}
	return len(o.Sending()) < len(o.cfg.Nodes) // both are sets of cfg.Nodes
}

// Sending is, once a staged operation ended Held, the nodes that send the
// new port: Switched and every batch's, sorted, each once.
func (o *Op) Sending() []string {
	var out []string
	out = append(out, o.cfg.Switched...)
	for _, b := range o.cfg.Batches {
		out = append(out, b...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// rollbackStep is how an operation that sent Commit is undone: staged
// ones switch every sender back before anyone stops listening.
func (o *Op) rollbackStep() Step {
	if o.staged() && !testNoUnswitch {
		return Unswitch
	}
	return Rollback
}

// batchNumber is the 1-based staged batch a step is for, 0 when none.
func (o *Op) batchNumber(step Step) int {
	if !o.staged() || (step != Commit && step != Verify && step != Confirm) {
		return 0
	}
	return o.batch + 1
}

// Batch is the staged batch (1-based) in flight or last run; 0 for an
// atomic operation or before the first Commit.
func (o *Op) Batch() int {
	if !o.staged() || !o.sentCommit {
		return 0
	}
	return o.batch + 1
}

// callHooks starts the hook calls due at point, one at a time; with none
// due it goes on at once.
func (o *Op) callHooks(point HookPoint) []Action {
	hooks := o.cfg.Hooks
	if point == HookRestore {
		hooks = slices.Clone(hooks)
		slices.Reverse(hooks)
	}
	o.hookQueue = nil
	for _, h := range hooks {
		if point == HookRestore && o.marks[hookKey{h, HookBeforeCommit}] == "" {
			continue // its BeforeCommit never started: nothing to put back
		}
		if due(point, o.marks[hookKey{h, point}]) {
			o.hookQueue = append(o.hookQueue, h)
		}
	}
	if len(o.hookQueue) == 0 {
		return o.hooksDone(point)
	}
	o.stage, o.hookPoint = stageHooks, point
	return o.callNextHook()
}

func (o *Op) callNextHook() []Action {
	h := o.hookQueue[0]
	o.marks[hookKey{h, o.hookPoint}] = MarkStarted
	return []Action{CallHook{Hook: h, Point: o.hookPoint, Timeout: o.cfg.StepTimeout, JournalFirst: o.hookPoint == HookBeforeCommit}}
}

func (o *Op) hookDone(e HookDone) []Action {
	if o.stage != stageHooks || e.Point != o.hookPoint || len(o.hookQueue) == 0 || e.Hook != o.hookQueue[0] {
		return nil // not the call in flight: a duplicate or a stray
	}
	k := hookKey{e.Hook, e.Point}
	o.hookQueue = o.hookQueue[1:]
	if e.Err == "" {
		o.marks[k] = MarkDone
	} else {
		o.marks[k] = MarkFailed
		switch e.Point {
		case HookBeforeCommit:
			// Nothing has flipped: abort, and skip the other hooks.
			o.failed = true
			if o.reason == "" {
				o.reason = fmt.Sprintf("%s failed: %s", Prepare, e.Err)
			}
			o.hookQueue = nil
		case HookRestore:
			o.notes = append(o.notes, e.Err+": what its before-commit changed may still be in place")
		default:
			o.notes = append(o.notes, e.Err)
		}
	}
	if len(o.hookQueue) > 0 {
		return o.callNextHook()
	}
	o.stage = stageBarrier
	return o.hooksDone(e.Point)
}

// hooksDone goes on once every hook call at point was made.
func (o *Op) hooksDone(point HookPoint) []Action {
	switch point {
	case HookBeforeCommit, HookAfterConfirm:
		// After AfterConfirm, Finalize goes out even if a rollback was
		// asked meanwhile: the finalize barrier takes the request.
		if point == HookAfterConfirm {
			return o.send(Finalize, o.cfg.Nodes)
		}
		if o.staged() && !o.failed && o.rollbackReq == "" {
			// Staged: BeforeCommit ran after the last batch confirmed.
			return o.callHooks(HookAfterConfirm)
		}
		return o.proceed()
	case HookFinalize:
		return o.succeed()
	default:
		return o.finish(o.ending)
	}
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

// undo starts an abort or rollback with a fresh retry budget.
func (o *Op) undo(step Step, nodes []string) []Action {
	o.tries, o.spent = 1, 0
	o.lastUndo = step
	return o.send(step, nodes)
}

// backoff is the pause before the next retry: RetryBackoff doubled once per
// retry already made, capped at RetryBackoffMax.
func (o *Op) backoff() time.Duration {
	d := o.cfg.RetryBackoff
	for i := 1; i < o.tries && d > 0; i++ {
		d *= 2
		if o.cfg.RetryBackoffMax > 0 && d >= o.cfg.RetryBackoffMax {
			return o.cfg.RetryBackoffMax
		}
	}
	if o.cfg.RetryBackoffMax > 0 {
		d = min(d, o.cfg.RetryBackoffMax)
	}
	return d
}

// withAfter sets the back-off pause on the Send among acts.
func withAfter(acts []Action, d time.Duration) []Action {
	for i, a := range acts {
		if s, ok := a.(Send); ok && d > 0 {
			s.After = d
			acts[i] = s
		}
	}
	return acts
}

// send starts step on nodes: journaled first, then sent.
func (o *Op) send(step Step, nodes []string) []Action {
	o.attempts[step]++
	o.step, o.attempt, o.stage = step, o.attempts[step], stageBarrier
	switch step {
	case Prepare:
		o.sentPrepare = true
	case Commit:
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
		Journal{Step: step, Attempt: o.attempt, CommitSent: o.sentCommit, Batch: b},
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
