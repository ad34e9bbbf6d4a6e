package barrier

import "time"

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
	// operation rolls back), and so is a node fed as Late. 0: lateness is
	// not judged here.
	LateBudget time.Duration
	// LateWait is the wait policy: a late node is the report's, never a
	// reason to undo; the Commit step waits for its answer (or its
	// timeout) like any other.
	LateWait bool
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
