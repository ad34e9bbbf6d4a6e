package opstate

import (
	"fmt"
	"sort"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// NoteLate records (or updates) a late node in the report.
func (op *Op) NoteLate(n string, lateness int64, applied bool) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	for _, l := range op.Report.LateNodes {
		if l.Node == n {
			l.LatenessNanos, l.Applied = lateness, applied
			return
		}
	}
	op.Report.LateNodes = append(op.Report.LateNodes, &coordinatorv1.LateNode{Node: n, LatenessNanos: lateness, Applied: applied})
	sort.Slice(op.Report.LateNodes, func(i, j int) bool { return op.Report.LateNodes[i].Node < op.Report.LateNodes[j].Node })
}

// LateWarningsLocked adds the report's warnings for a SUCCEEDED operation
// whose late nodes applied anyway (the wait policy): the overlay was split
// while they were away, so this is not a clean success. op.Mu is held.
func LateWarningsLocked(op *Op, out barrier.Outcome) {
	if out != barrier.Succeeded {
		return
	}
	for _, l := range op.Report.LateNodes {
		if l.Applied {
			op.Report.Warnings = append(op.Report.Warnings, fmt.Sprintf("node %s applied the commit %s after the instant (lateness budget %s): the overlay was split meanwhile",
				l.Node, time.Duration(l.LatenessNanos).Round(time.Millisecond), time.Duration(op.Report.LateBudgetNanos)))
		}
	}
}

// SpreadWarningLocked adds the report's warning for a SUCCEEDED atomic
// operation whose commit spread (the nodes' wake-ups) exceeded target:
// the barrier did not hold, every node flipped but not together, and the
// overlay was split for that long between the first and the last (in
// the lab a 142 ms spread with 340 probes lost once passed as a clean
// success). A warning, not a failure: the change is complete and
// verified; coordctl exits 7. op.Mu is held.
func SpreadWarningLocked(op *Op, out barrier.Outcome, target time.Duration) {
	r := op.Report
	if out != barrier.Succeeded || target <= 0 || r.GetStrategy() == "staged" {
		return
	}
	if s := time.Duration(r.GetCommitSpreadNanos()); s > target {
		r.Warnings = append(r.Warnings, fmt.Sprintf("commit spread %s is above the target %s (--commit-spread-target): the nodes did not flip together (effect spread %s), so the overlay was split meanwhile; see the probe disruption and the nodes' load",
			s.Round(100*time.Microsecond), target, time.Duration(r.GetEffectSpreadNanos()).Round(100*time.Microsecond)))
	}
}
