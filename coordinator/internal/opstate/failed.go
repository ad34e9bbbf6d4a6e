package opstate

import (
	"fmt"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// selfUndoLocked says when an unreached node undoes the operation by
// itself, as far as the coordinator knows: the deadline it reported (its
// prepare deadline while prepared, its dead-man once committed), or what
// follows from the commit instant and the dead-man sent with it. The
// timers run in the agent: a stopped agent acts on a passed deadline as
// soon as it starts again, and not before.
func (op *Op) selfUndoLocked(node string, now time.Time) string {
	when := func(t time.Time) string {
		at := t.UTC().Format("15:04:05.000Z")
		if d := t.Sub(now).Round(100 * time.Millisecond); d > 0 {
			return fmt.Sprintf("%s (in %s)", at, d)
		}
		return fmt.Sprintf("%s (passed %s ago)", at, now.Sub(t).Round(100*time.Millisecond))
	}
	const passed = "a running agent has undone the operation by itself, a stopped one does as soon as it starts again; check it"
	dl, known := op.selfUndo[node]
	kind := op.selfKind[node]
	commitSent := op.Core.CommitSent() && !op.CommitAt.IsZero()
	deadman := op.CommitAt.Add(op.Deadman)
	const prepTimeout = "the agent's --prepare-timeout after its Prepare, 5m by default"
	switch {
	case known && kind == agentv1.Phase_PHASE_COMMITTED:
		if dl.Before(now) {
			return "committed; its dead-man deadline passed at " + when(dl) + ": " + passed
		}
		return "committed; its dead-man reverts it by itself at " + when(dl)
	case known && commitSent:
		if dl.Before(now) && deadman.Before(now) {
			return "prepared, and its prepare deadline (" + when(dl) + ") and the dead-man of the commit sent to it (" + when(deadman) + ") both passed: " + passed
		}
		return "prepared, and the commit may or may not have reached it: if it did, its dead-man reverts it at " + when(deadman) + "; if not, it aborts at its prepare deadline " + when(dl)
	case known:
		if dl.Before(now) {
			return "prepared at most (nothing flipped); its prepare deadline passed at " + when(dl) + ": " + passed
		}
		return "prepared at most (nothing flipped); it aborts by itself at its prepare deadline " + when(dl)
	case commitSent:
		return "state unknown: if it committed, its dead-man reverts it at " + when(deadman) + "; if it only prepared, it aborts at its prepare deadline (" + prepTimeout + ")"
	}
	return "state unknown, prepared at most (nothing flipped): if it prepared, it aborts by itself at its prepare deadline (" + prepTimeout + ")"
}

// FailedErrorLocked is the report's error of an operation whose abort or
// rollback could not reach every agent: who, how hard it was tried, and
// when each unreached node undoes the operation by itself. op.Mu is held.
func FailedErrorLocked(op *Op, d barrier.Declare, now time.Time) string {
	undo := "rollback"
	if !op.Core.CommitSent() {
		undo = "abort"
	}
	took := now.Sub(op.StepStart).Round(100 * time.Millisecond)
	msg := fmt.Sprintf("%s; %s could not reach %s (%d attempts over %s): an operator must check %s",
		d.Reason, undo, strings.Join(d.Unreached, ","), op.Core.Tries(), took, map[bool]string{true: "it", false: "them"}[len(d.Unreached) == 1])
	for _, n := range d.Unreached {
		msg += "; " + n + ": " + op.selfUndoLocked(n, now)
	}
	return msg
}
