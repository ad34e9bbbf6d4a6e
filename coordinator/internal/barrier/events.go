package barrier

import "time"

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

// JournalFailed is a Journal action's write that failed (Err): fed back
// at once, before the actions after it.
type JournalFailed struct {
	Step    Step
	Attempt int
	Err     string
}

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
func (JournalFailed) isEvent()     {}
