package barrier

import "time"

// undo starts an abort or rollback with a fresh retry budget.
func (o *Op) undo(step Step, nodes []string) []Action {
	o.tries, o.spent = 1, 0
	o.lastUndo = step
	return o.send(step, nodes)
}

// retry is the end of an abort, rollback or unswitch barrier that missed
// the nodes bad: the step goes out again, to them only, after a back-off,
// while the retry budget lasts (RollbackAttempts in all, and RetryFor of
// pauses and timed-out attempts); past it the operation is Failed, naming
// them.
func (o *Op) retry(bad []string) []Action {
	timedOut := false
	for _, n := range bad {
		timedOut = timedOut || o.pending[n] == StatusTimeout
	}
	if timedOut {
		o.spent += o.cfg.StepTimeout
	}
	if o.tries < o.cfg.RollbackAttempts || (o.cfg.RetryBackoff > 0 && o.spent < o.cfg.RetryFor) {
		pause := o.backoff()
		if o.tries >= o.cfg.RollbackAttempts && o.cfg.RetryFor > 0 {
			// Past the minimum count only to cover RetryFor: the last
			// pause ends just there, not a doubling beyond it.
			pause = min(pause, o.cfg.RetryFor-o.spent)
		}
		o.spent += pause
		o.tries++
		acts := o.send(o.step, bad)
		return withAfter(acts, pause)
	}
	o.unreached = bad
	return o.finish(Failed)
}

// backoff is the pause before the next retry: RetryBackoff doubled once per
// retry already made, capped at RetryBackoffMax.
func (o *Op) backoff() time.Duration {
	d := o.cfg.RetryBackoff
	for i := 1; i < o.tries && d > 0; i++ {
		d *= 2
		if o.cfg.RetryBackoffMax > 0 && d >= o.cfg.RetryBackoffMax {
			return o.cfg.RetryBackoffMax
		}
	}
	if o.cfg.RetryBackoffMax > 0 {
		d = min(d, o.cfg.RetryBackoffMax)
	}
	return d
}

// withAfter sets the back-off pause on the Send among acts.
func withAfter(acts []Action, d time.Duration) []Action {
	for i, a := range acts {
		if s, ok := a.(Send); ok && d > 0 {
			s.After = d
			acts[i] = s
		}
	}
	return acts
}
