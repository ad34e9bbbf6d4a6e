package runner

import (
	"fmt"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// lateBudgetMillis is the budget the agents get in CommitRequest: under
// the wait policy they apply however late.
func (rn *Runner) lateBudgetMillis() int64 {
	if rn.Cfg.LatePolicy != config.LateRollback {
		return 0
	}
	return rn.Cfg.LateBudget.Milliseconds()
}

// lateWatch watches one Commit send for nodes that do not answer by the
// instant plus the answer deadline, and reports nodes that applied past
// the budget. It decides nothing: the core judges the applied lateness
// (barrier.Config.LateBudget, Reply.Lateness) and a Late event for a node
// without an answer, by the policy (barrier.Config.LateWait); the watch
// tells the operation's followers and the report.
type lateWatch struct {
	rn       *Runner
	op       *opstate.Op
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
func (rn *Runner) watchLate(op *opstate.Op, s barrier.Send, at time.Time, post func(barrier.Event)) *lateWatch {
	w := &lateWatch{rn: rn, op: op, s: s, at: at, answered: map[string]bool{}, late: map[string]bool{}, done: make(chan struct{})}
	op.NoteLatePolicy(rn.Cfg.LateBudget, rn.Cfg.LatePolicy)
	if rn.Cfg.LateBudget <= 0 {
		return w
	}
	w.wg.Go(func() {
		t := time.NewTimer(time.Until(at.Add(rn.Cfg.AnswerDeadline)))
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
			if rn.Cfg.LatePolicy == config.LateRollback {
				then = "rolling everyone back"
			}
			op.Emit(string(barrier.Commit), n, fmt.Sprintf("late: no answer %s after the commit instant (answer deadline %s): %s",
				since.Round(time.Millisecond), rn.Cfg.AnswerDeadline, then), true, nil)
			op.NoteLate(n, since.Nanoseconds(), false)
			rn.Metrics.LateCommits.Inc()
			post(barrier.Late{Node: n, Attempt: s.Attempt}) // the core judges it by the policy
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
	return time.Duration(applied-w.at.UnixNano()) - w.op.Offsets[n].RTT/2
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
	if w.rn.Cfg.LateBudget <= 0 {
		return
	}
	lateness := w.lateness(n, applied)
	ok := applied != 0 && r.GetReadbackPort() == w.op.To.Wire()
	switch {
	case wasLate && ok:
		w.op.NoteLate(n, lateness.Nanoseconds(), true)
		w.op.Emit(string(barrier.Commit), n, fmt.Sprintf("late node applied %s after the commit instant", lateness.Round(time.Millisecond)), true, nil)
	case wasLate:
		w.op.Emit(string(barrier.Commit), n, fmt.Sprintf("late node answered %s after the commit instant without applying: %s",
			time.Since(w.at).Round(time.Millisecond), r.GetStatus().GetError()), true, nil)
	case ok && lateness > w.rn.Cfg.LateBudget:
		w.op.NoteLate(n, lateness.Nanoseconds(), true)
		w.rn.Metrics.LateCommits.Inc()
		w.op.Emit(string(barrier.Commit), n, fmt.Sprintf("late: applied %s after the commit instant (budget %s)", lateness.Round(time.Millisecond), w.rn.Cfg.LateBudget), true, nil)
	}
}

// refused records node n's refusal to commit for lateness: it reached the
// instant d after it (its own clock's measure) and applied nothing. It is a
// late node whether or not its answer beat the answer deadline: the report
// names it so, not only as a failed call.
func (w *lateWatch) refused(n string, d time.Duration) {
	if w == nil || w.rn.Cfg.LateBudget <= 0 {
		return
	}
	w.mu.Lock()
	counted := w.late[n]
	w.late[n] = true
	w.mu.Unlock()
	w.op.NoteLate(n, d.Nanoseconds(), false)
	if !counted {
		w.rn.Metrics.LateCommits.Inc()
	}
	w.op.Emit(string(barrier.Commit), n, fmt.Sprintf("late: reached the commit instant %s after it and applied nothing (budget %s)",
		d.Round(time.Millisecond), w.rn.Cfg.LateBudget), true, nil)
}

func (w *lateWatch) stop() {
	close(w.done)
	w.wg.Wait()
}
