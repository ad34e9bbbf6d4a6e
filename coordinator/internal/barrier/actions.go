package barrier

import (
	"fmt"
	"strings"
	"time"
)

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
	// ResetProbes: the calls carry the probe counters' reset (the first
	// Prepare: at 10,000 agents a separate reset was 10,000 calls more
	// inside the prepare round). The ResetProbes action beside it then
	// resets only the agents that did not take it.
	ResetProbes bool
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
// actions that follow. A write that fails is fed back as JournalFailed,
// at once, before anything else. Required: the actions after it in the
// same list must not be performed unless it was written; the caller
// performs what Step(JournalFailed) returns instead. A Commit is required
// to be journaled: after a crash the record must never claim less than
// what the agents may have seen.
type Journal struct {
	Step       Step
	Attempt    int
	CommitSent bool
	Batch      int // as Send.Batch
	Required   bool
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
// feed back ProbesReset. Rode: the Send in the same list carried the
// reset; once its calls ended, zero those of the agents that did not say
// theirs were (agents older than the field).
type ResetProbes struct{ Rode bool }

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
	s := fmt.Sprintf("journal %s#%d commit-sent=%t", j.Step, j.Attempt, j.CommitSent)
	if j.Batch > 0 {
		s = fmt.Sprintf("journal %s#%d batch=%d commit-sent=%t", j.Step, j.Attempt, j.Batch, j.CommitSent)
	}
	if j.Required {
		s += " (required before the send)"
	}
	return s
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

func (r ResetProbes) String() string {
	if r.Rode {
		return "reset-probes of the agents the prepare did not reset"
	}
	return "reset-probes"
}
func (ReadProbes) String() string { return "read-probes" }

func (s Send) String() string {
	str := fmt.Sprintf("send %s#%d to %s within %s", s.Step, s.Attempt, strings.Join(s.Nodes, ","), s.Timeout)
	if s.Batch > 0 {
		str += fmt.Sprintf(" batch %d", s.Batch)
	}
	if s.After > 0 {
		str += " after " + s.After.String()
	}
	if s.ResetProbes {
		str += " carrying the probe reset"
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
