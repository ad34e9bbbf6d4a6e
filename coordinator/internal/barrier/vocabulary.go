package barrier

import "fmt"

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
