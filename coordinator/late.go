package coordinator

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// lateBudgetMillis is the budget the agents get in CommitRequest: under
// the wait policy they apply however late.
func (c *Coordinator) lateBudgetMillis() int64 {
	if c.cfg.LatePolicy != LateRollback {
		return 0
	}
	return c.cfg.LateBudget.Milliseconds()
}

// lateWatch watches one Commit send for nodes that do not answer by the
// instant plus the answer deadline, and reports nodes that applied past
// the budget. It decides nothing: under the rollback policy the core
// judges the applied lateness (barrier.Config.LateBudget, Reply.Lateness)
// and is fed a Late event for a node without an answer; under both it
// tells the operation's followers and the report.
type lateWatch struct {
	c        *Coordinator
	op       *operation
	s        barrier.Send
	at       time.Time // the commit instant, coordinator clock
	mu       sync.Mutex
	answered map[string]bool
	late     map[string]bool
	done     chan struct{}
	wg       sync.WaitGroup
}

// watchLate starts the watch; stop it (it waits for its goroutine) once
// every Commit call returned.
func (c *Coordinator) watchLate(op *operation, s barrier.Send, at time.Time, post func(barrier.Event)) *lateWatch {
	w := &lateWatch{c: c, op: op, s: s, at: at, answered: map[string]bool{}, late: map[string]bool{}, done: make(chan struct{})}
	op.mu.Lock()
	op.report.LateBudgetNanos, op.report.LatePolicy = c.cfg.LateBudget.Nanoseconds(), c.cfg.LatePolicy
	op.mu.Unlock()
	if c.cfg.LateBudget <= 0 {
		return w
	}
	w.wg.Go(func() {
		t := time.NewTimer(time.Until(at.Add(c.cfg.AnswerDeadline)))
		defer t.Stop()
		select {
		case <-t.C:
		case <-w.done:
			return
		}
		w.mu.Lock()
		var late []string
		for _, n := range s.Nodes {
			if !w.answered[n] {
				w.late[n] = true
				late = append(late, n)
			}
		}
		w.mu.Unlock()
		for _, n := range late {
			since := time.Since(at)
			then := "waiting for it (--commit-late-policy=wait): the overlay is split meanwhile"
			if c.cfg.LatePolicy == LateRollback {
				then = "rolling everyone back"
			}
			op.emit(string(barrier.Commit), n, fmt.Sprintf("late: no answer %s after the commit instant (answer deadline %s): %s",
				since.Round(time.Millisecond), c.cfg.AnswerDeadline, then), true, nil)
			op.noteLate(n, since.Nanoseconds(), false)
			c.metrics.LateCommits.Inc()
			if c.cfg.LatePolicy == LateRollback {
				post(barrier.Late{Node: n, Attempt: s.Attempt})
			}
		}
	})
	return w
}

// lateness is how late node n applied, judged for the core: applied (the
// coordinator-clock Unix nano its report converts to; 0: it did not
// apply) minus the instant, less the offset's error bound (half the round
// trip it was measured with), so that a node is never judged late by the
// error of its clock's offset. 0 when it did not apply.
func (w *lateWatch) lateness(n string, applied int64) time.Duration {
	if w == nil || applied == 0 {
		return 0
	}
	return time.Duration(applied-w.at.UnixNano()) - w.op.offsets[n].RTT/2
}

// answer records node n's Commit answer: applied at the coordinator-clock
// Unix nano applied (0: it did not apply). A node is late by when it
// applied, not by when its answer arrived; one that applied past the
// budget is late even if its answer beat the timer, one that applied on
// time is not, however late its answer (before the answer deadline).
func (w *lateWatch) answer(n string, applied int64, r *agentv1.CommitResponse) {
	if w == nil {
		return // no instant to be late for (a staged switch)
	}
	w.mu.Lock()
	w.answered[n] = true
	wasLate := w.late[n]
	w.mu.Unlock()
	if w.c.cfg.LateBudget <= 0 {
		return
	}
	lateness := w.lateness(n, applied)
	ok := applied != 0 && r.GetReadbackPort() == w.op.to
	switch {
	case wasLate && ok:
		w.op.noteLate(n, lateness.Nanoseconds(), true)
		w.op.emit(string(barrier.Commit), n, fmt.Sprintf("late node applied %s after the commit instant", lateness.Round(time.Millisecond)), true, nil)
	case wasLate:
		w.op.emit(string(barrier.Commit), n, fmt.Sprintf("late node answered %s after the commit instant without applying: %s",
			time.Since(w.at).Round(time.Millisecond), r.GetStatus().GetError()), true, nil)
	case ok && lateness > w.c.cfg.LateBudget:
		w.op.noteLate(n, lateness.Nanoseconds(), true)
		w.c.metrics.LateCommits.Inc()
		w.op.emit(string(barrier.Commit), n, fmt.Sprintf("late: applied %s after the commit instant (budget %s)", lateness.Round(time.Millisecond), w.c.cfg.LateBudget), true, nil)
	}
}

func (w *lateWatch) stop() {
	close(w.done)
	w.wg.Wait()
}

// noteLate records (or updates) a late node in the report.
func (op *operation) noteLate(n string, lateness int64, applied bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	for _, l := range op.report.LateNodes {
		if l.Node == n {
			l.LatenessNanos, l.Applied = lateness, applied
			return
		}
	}
	op.report.LateNodes = append(op.report.LateNodes, &coordinatorv1.LateNode{Node: n, LatenessNanos: lateness, Applied: applied})
	sort.Slice(op.report.LateNodes, func(i, j int) bool { return op.report.LateNodes[i].Node < op.report.LateNodes[j].Node })
}

// lateWarningsLocked adds the report's warnings for a SUCCEEDED operation
// whose late nodes applied anyway (the wait policy): the overlay was split
// while they were away, so this is not a clean success. op.mu is held.
func lateWarningsLocked(op *operation, out barrier.Outcome) {
	if out != barrier.Succeeded {
		return
	}
	for _, l := range op.report.LateNodes {
		if l.Applied {
			op.report.Warnings = append(op.report.Warnings, fmt.Sprintf("node %s applied the commit %s after the instant (lateness budget %s): the overlay was split meanwhile",
				l.Node, time.Duration(l.LatenessNanos).Round(time.Millisecond), time.Duration(op.report.LateBudgetNanos)))
		}
	}
}

// spreadWarningLocked adds the report's warning for a SUCCEEDED atomic
// operation whose commit spread (the nodes' wake-ups) exceeded target:
// the barrier did not hold, every node flipped but not together, and the
// overlay was split for that long between the first and the last (in
// the lab a 142 ms spread with 340 probes lost once passed as a clean
// success). A warning, not a failure: the change is complete and
// verified; coordctl exits 7. op.mu is held.
func spreadWarningLocked(op *operation, out barrier.Outcome, target time.Duration) {
	r := op.report
	if out != barrier.Succeeded || target <= 0 || r.GetStrategy() == "staged" {
		return
	}
	if s := time.Duration(r.GetCommitSpreadNanos()); s > target {
		r.Warnings = append(r.Warnings, fmt.Sprintf("commit spread %s is above the target %s (--commit-spread-target): the nodes did not flip together (effect spread %s), so the overlay was split meanwhile; see the probe disruption and the nodes' load",
			s.Round(100*time.Microsecond), target, time.Duration(r.GetEffectSpreadNanos()).Round(100*time.Microsecond)))
	}
}
