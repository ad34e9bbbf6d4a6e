package machineconfig

import (
	"fmt"
	"time"
)

// Step is where a node stands in the rollout to a target config. It is
// derived from the node's annotations alone (Decide), so the node itself is
// the primary record: a restarted driver reads the same step a killed one
// left, and the journal only adds when each step began.
type Step string

// The steps in protocol order (the MCC's drain controller; docs/machineconfig.md).
const (
	StepPending             Step = "Pending"             // desiredConfig is not the target yet
	StepWaitDrainRequest    Step = "WaitDrainRequest"    // desiredConfig set; the MCD has not asked for drain-<target>
	StepDrain               Step = "Drain"               // drain-<target> asked and not answered: cordon, evict, answer
	StepWaitUncordonRequest Step = "WaitUncordonRequest" // drain answered; the MCD applies the config and reboots
	StepUncordon            Step = "Uncordon"            // uncordon-<target> asked and not answered: uncordon, answer
	StepWaitCurrent         Step = "WaitCurrent"         // uncordon answered; waiting for currentConfig=target, state Done
	StepDone                Step = "Done"                // currentConfig = desiredConfig = target, state Done
	StepFailed              Step = "Failed"              // the MCD reports Degraded or Unreconcilable
)

// InProgress reports whether a node at s counts against max-unavailable.
func (s Step) InProgress() bool { return s != StepPending && s != StepDone }

// Action is what the driver must do for a node now.
type Action string

const (
	ActWait       Action = "wait"        // nothing to write: the MCD's turn
	ActSetDesired Action = "set-desired" // write desiredConfig = target
	ActDrain      Action = "drain"       // cordon, evict (PDBs honoured), then lastAppliedDrain = drain-<target>
	ActUncordon   Action = "uncordon"    // uncordon, then lastAppliedDrain = uncordon-<target>
	ActNone       Action = "none"        // done
	ActFail       Action = "fail"        // stop the rollout, report the MCD's reason
)

// Decide returns the node's step toward target and the action it needs.
// A node whose desiredConfig names another config is Pending even if it is
// mid-update to it: setting the target retargets it, as the MCC does when a
// pool's config changes during an update.
func Decide(target string, v NodeView) (Step, Action) {
	switch {
	case v.Failed():
		return StepFailed, ActFail
	case v.Desired != target:
		return StepPending, ActSetDesired
	}
	drain, uncordon := DrainRequest(target), UncordonRequest(target)
	// An unanswered request comes before Done: a rebootless update (and
	// the MCD's "no diff, assume completed" path) writes currentConfig,
	// state Done and uncordon-<target> at once, and the node stays
	// cordoned until the request is answered.
	switch {
	case v.DesiredDrain == drain && v.LastAppliedDrain != drain:
		return StepDrain, ActDrain
	case v.DesiredDrain == uncordon && v.LastAppliedDrain != uncordon:
		return StepUncordon, ActUncordon
	case v.Current == target && v.State == StateDone:
		return StepDone, ActNone
	case v.DesiredDrain == drain:
		return StepWaitUncordonRequest, ActWait
	case v.DesiredDrain == uncordon:
		return StepWaitCurrent, ActWait
	}
	// desiredDrain still names an older config (or nothing). An MCD that
	// applies a change needing no drain goes straight to currentConfig,
	// which the StepDone case catches.
	return StepWaitDrainRequest, ActWait
}

// Timeouts bound the waits on the MCD and on evictions.
type Timeouts struct {
	// MCD bounds each wait for the MCD: the drain request, the
	// reboot up to the uncordon request, currentConfig after it.
	MCD time.Duration
	// Drain bounds cordon+evict of one node (PDBs may block it).
	Drain time.Duration
}

// Overdue returns an error naming the node when it has been at a waiting
// step longer than the timeout allows; since is when the step began.
func Overdue(node string, s Step, since, now time.Time, t Timeouts) error {
	var limit time.Duration
	var what string
	switch s {
	case StepWaitDrainRequest:
		limit, what = t.MCD, "the MCD did not ask for a drain (desiredDrain) after desiredConfig was set"
	case StepWaitUncordonRequest:
		limit, what = t.MCD, "the MCD did not ask for an uncordon (desiredDrain) after the drain was answered: the update or the reboot is stuck"
	case StepWaitCurrent:
		limit, what = t.MCD, "the MCD did not set currentConfig and state Done after the uncordon was answered"
	case StepDrain:
		limit, what = t.Drain, "the drain did not finish (a PodDisruptionBudget may block an eviction)"
	default:
		return nil
	}
	if limit <= 0 || since.IsZero() || now.Sub(since) < limit {
		return nil
	}
	return &TimeoutError{Node: node, Step: s, After: limit, What: what}
}

// TimeoutError is a node that stayed too long at a step.
type TimeoutError struct {
	Node  string
	Step  Step
	After time.Duration
	What  string
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("node %s: timed out after %s at step %s: %s", e.Node, e.After, e.Step, e.What)
}

// FailedError is a node the MCD gave up on.
type FailedError struct {
	Node, State, Reason string
}

func (e *FailedError) Error() string {
	r := e.Reason
	if r == "" {
		r = "(the MCD gave no reason)"
	}
	return fmt.Sprintf("node %s: the machine-config-daemon reports %s: %s", e.Node, e.State, r)
}

// Start picks which Pending nodes to start now: in order, while fewer
// than maxUnavailable nodes are in progress. No node starts while any node
// has failed: a Degraded node stops the rollout.
//
// Unlike the MCC, Pending nodes that are NotReady or cordoned are not
// counted against maxUnavailable: when this tool is needed the CNI is
// usually broken, so the kubelets report NetworkNotReady on every node,
// and counting them would start nothing ever.
func Start(target string, nodes []NodeView, maxUnavailable int) []string {
	busy := 0
	var pending []string
	for _, v := range nodes {
		s, _ := Decide(target, v)
		switch {
		case s == StepFailed:
			return nil
		case s.InProgress():
			busy++
		case s == StepPending:
			pending = append(pending, v.Name)
		}
	}
	if free := maxUnavailable - busy; free > 0 {
		return pending[:min(free, len(pending))]
	}
	return nil
}
