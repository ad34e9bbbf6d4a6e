package operation

import (
	"errors"
	"fmt"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Phase is where an operation stands on this node. The names match the
// agent API's Phase enum, plus PREPARING, which only the agent sees.
type Phase string

// Phases. PREPARING is the persisted intent written before the backend's
// Prepare runs: after a crash in that window the agent cannot know how far
// Prepare got, so recovery aborts it (Abort is idempotent).
const (
	PhaseIdle      Phase = "IDLE"
	PhasePreparing Phase = "PREPARING"
	PhasePrepared  Phase = "PREPARED"
	PhaseCommitted Phase = "COMMITTED"
	PhaseConfirmed Phase = "CONFIRMED"
	PhaseReverted  Phase = "REVERTED"
	PhaseAborted   Phase = "ABORTED"
	PhaseFinalized Phase = "FINALIZED"
	PhaseFailed    Phase = "FAILED"
)

// Phases lists every phase, for metrics.
var Phases = []Phase{PhaseIdle, PhasePreparing, PhasePrepared, PhaseCommitted, PhaseConfirmed,
	PhaseReverted, PhaseAborted, PhaseFinalized, PhaseFailed}

// InFlight reports whether an operation in phase p blocks a new one.
// CONFIRMED is in flight: the old port's firewall rules are still there
// until Finalize (or a Rollback) ends it.
func (p Phase) InFlight() bool {
	switch p {
	case PhasePreparing, PhasePrepared, PhaseCommitted, PhaseConfirmed:
		return true
	}
	return false
}

// Strategies (Record.Strategy). An empty strategy is atomic: records
// written before staged existed read back as atomic.
const (
	StrategyAtomic = "atomic"
	StrategyStaged = "staged"
)

// Staged reports whether the record is a staged operation's.
func (r Record) Staged() bool { return r.Strategy == StrategyStaged }

// Who ended an operation (Record.RevertedBy).
const (
	ByRollback       = "rollback"
	ByDeadman        = "deadman"
	ByPrepareTimeout = "prepare-timeout"
	ByRestart        = "restart"       // a prepare interrupted by an agent restart
	ByApplyFailure   = "apply-failure" // the commit failed and was put back at once
	ByLate           = "late"          // the commit came past its lateness budget: not applied
)

// Record is the persisted state of the current or last operation. Times are
// the agent's own clock.
type Record struct {
	ID       string              `json:"id"`
	Phase    Phase               `json:"phase"`
	FromPort tunnelport.Port     `json:"from_port,omitempty"`
	ToPort   tunnelport.Port     `json:"to_port,omitempty"`
	Snapshot *dataplane.Snapshot `json:"snapshot,omitempty"`
	// Strategy is StrategyStaged for a make-before-break operation (the
	// backend's Stager methods); empty for the one-instant flip.
	Strategy string `json:"strategy,omitempty"`

	PrepareDeadline time.Time       `json:"prepare_deadline,omitzero"` // abort by itself after
	CommitAt        time.Time       `json:"commit_at,omitzero"`        // as requested
	Deadman         time.Duration   `json:"deadman_ns,omitempty"`
	Deadline        time.Time       `json:"deadline,omitzero"`  // dead-man deadline
	Applied         time.Time       `json:"applied,omitzero"`   // when Commit woke and called the backend
	Written         time.Time       `json:"written,omitzero"`   // when the change left for the dataplane
	Effective       time.Time       `json:"effective,omitzero"` // when the dataplane confirmed it
	ApplyDuration   time.Duration   `json:"apply_ns,omitempty"`
	Lateness        time.Duration   `json:"lateness_ns,omitempty"` // applied - commit_at
	ReadbackPort    tunnelport.Port `json:"readback_port,omitempty"`
	CurrentPort     tunnelport.Port `json:"current_port,omitempty"` // last read back

	Error      string    `json:"error,omitempty"`
	RevertedBy string    `json:"reverted_by,omitempty"`
	Ended      time.Time `json:"ended,omitzero"`
	Updated    time.Time `json:"updated,omitzero"`
}

func (r Record) valid() error {
	switch {
	case r.ID == "":
		return errors.New("record has no operation id")
	case r.Phase == PhaseIdle || r.Phase == "":
		return fmt.Errorf("record %s has phase %q", r.ID, r.Phase)
	}
	for _, p := range Phases {
		if p == r.Phase {
			if r.Phase.InFlight() && r.Snapshot == nil {
				return fmt.Errorf("record %s in phase %s has no snapshot", r.ID, r.Phase)
			}
			return nil
		}
	}
	return fmt.Errorf("record %s has unknown phase %q", r.ID, r.Phase)
}

// Code classifies a machine error; the gRPC service maps it to a status
// code.
type Code int

// Codes.
const (
	CodeInvalidArgument    Code = iota + 1 // the request contradicts the operation's record
	CodeFailedPrecondition                 // not allowed in the current phase
	CodeNotFound                           // unknown operation id
	CodeUnavailable                        // the state store cannot persist: nothing was done
	CodeAborted                            // the step failed and was undone
	CodeInternal                           // the step failed and could not be undone
)

// Error is what the machine's methods return.
type Error struct {
	Code Code
	Msg  string
	Err  error
	// Late is how late the agent reached a commit it refused for being
	// late (0: not such a refusal): the coordinator reports the node late
	// by it.
	Late time.Duration
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	if e.Msg == "" {
		return e.Err.Error()
	}
	return e.Msg + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// CodeOf returns the Code of err, or 0 when err is not a machine *Error.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// LateOf is how late a commit refused for lateness was (0: err is no such
// refusal).
func LateOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.Late
	}
	return 0
}

func errf(c Code, err error, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Observer is told about what the metrics report. Its methods are called
// with the machine's lock held and must be quick.
type Observer interface {
	PhaseChanged(p Phase)
	Applied(apply, lateness time.Duration)
	DeadmanReverted()
	PortObserved(port tunnelport.Port)
}

type nopObserver struct{}

func (nopObserver) PhaseChanged(Phase)                   {}
func (nopObserver) Applied(time.Duration, time.Duration) {}
func (nopObserver) DeadmanReverted()                     {}
func (nopObserver) PortObserved(tunnelport.Port)         {}
