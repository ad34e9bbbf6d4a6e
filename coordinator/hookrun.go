package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
)

// Hook points, as journaled in Record.Hooks.
const (
	HookBeforeCommit = "before-commit"
	HookAfterConfirm = "after-confirm"
	HookFinalize     = "finalize"
	HookRestore      = "restore"
)

// States of a journaled hook call.
const (
	HookStarted = "started" // journaled before the call: it may have acted
	HookDone    = "done"
	HookFailed  = "failed"
)

// HookMark is one hook call of an operation. It is journaled before the
// call (started) and after it (done or failed), so a coordinator restarted
// in between knows the call may have acted.
type HookMark struct {
	Hook  string `json:"hook"`  // Hook.Name()
	Point string `json:"point"` // HookBeforeCommit, ...
	State string `json:"state"` // HookStarted, HookDone or HookFailed
	Error string `json:"error,omitempty"`
}

// hookMark returns the journaled state of hook h at point ("" if never
// called).
func (op *operation) hookMark(h, point string) string {
	op.mu.Lock()
	defer op.mu.Unlock()
	for _, m := range op.rec.Hooks {
		if m.Hook == h && m.Point == point {
			return m.State
		}
	}
	return ""
}

func (op *operation) setHookMark(m HookMark) {
	op.mu.Lock()
	defer op.mu.Unlock()
	for i := range op.rec.Hooks {
		if op.rec.Hooks[i].Hook == m.Hook && op.rec.Hooks[i].Point == m.Point {
			op.rec.Hooks[i] = m
			return
		}
	}
	op.rec.Hooks = append(op.rec.Hooks, m)
}

func (op *operation) info() OpInfo {
	op.mu.Lock()
	defer op.mu.Unlock()
	return OpInfo{ID: op.rec.ID, Kind: op.rec.Kind, FromPort: op.from, ToPort: op.to, Nodes: slices.Clone(op.nodes)}
}

// due says whether a hook call at point must be made given its journaled
// state. BeforeCommit is never repeated: once started it may have acted,
// and the operation is undone (Restore) instead. AfterConfirm and Finalize
// run after the dataplane is verified good: one that a restart
// interrupted (started, never finished) is made again by the resumed run,
// so the source of truth converges; one that finished (done or failed)
// is not. Restore is made again until it succeeds, at the end of any later
// run (it puts a state back: repeating it is harmless, skipping it is not).
func due(point, state string) bool {
	switch point {
	case HookBeforeCommit:
		return state == ""
	case HookAfterConfirm, HookFinalize:
		return state == "" || state == HookStarted
	default: // restore
		return state != HookDone
	}
}

// callHook makes one journaled hook call. A BeforeCommit that cannot be
// journaled first is not made: after a crash nobody would know to Restore.
func (c *Coordinator) callHook(op *operation, h Hook, point string, f func(context.Context, OpInfo) error) error {
	name := h.Name()
	op.setHookMark(HookMark{Hook: name, Point: point, State: HookStarted})
	if err := c.save(op); err != nil && point == HookBeforeCommit {
		op.setHookMark(HookMark{Hook: name, Point: point, State: HookFailed, Error: "not journaled: " + err.Error()})
		return fmt.Errorf("hook %s %s: not called, the journal refused the write: %w", name, point, err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, op.step)
	err := f(ctx, op.info())
	cancel()
	m := HookMark{Hook: name, Point: point, State: HookDone}
	if err != nil {
		m.State, m.Error = HookFailed, err.Error()
		err = fmt.Errorf("hook %s %s: %w", name, point, err)
		op.emit(point, "", err.Error(), true, nil)
		c.log.Error("hook", "operation", op.rec.ID, "hook", name, "point", point, "err", err)
	} else {
		op.emit(point, "", fmt.Sprintf("hook %s %s: ok", name, point), false, nil)
	}
	op.setHookMark(m)
	_ = c.save(op)
	return err
}

// beforeCommit calls every hook's BeforeCommit in order; the first error
// stops the others and aborts the operation (nothing has flipped yet).
func (c *Coordinator) beforeCommit(op *operation) error {
	for _, h := range c.hooks {
		if !due(HookBeforeCommit, op.hookMark(h.Name(), HookBeforeCommit)) {
			continue
		}
		if err := c.callHook(op, h, HookBeforeCommit, h.BeforeCommit); err != nil {
			return err
		}
	}
	return nil
}

// afterSuccess calls AfterConfirm or Finalize on every hook, in order,
// all of them even when one fails: the change stays, errors are reported.
func (c *Coordinator) afterSuccess(op *operation, point string) {
	for _, h := range c.hooks {
		if !due(point, op.hookMark(h.Name(), point)) {
			continue
		}
		f := h.AfterConfirm
		if point == HookFinalize {
			f = h.Finalize
		}
		if err := c.callHook(op, h, point, f); err != nil {
			op.addHookError(err)
		}
	}
}

// restore calls Restore, in reverse order, on every hook whose
// BeforeCommit was started (it may have acted even if it failed).
func (c *Coordinator) restore(op *operation) {
	for _, h := range slices.Backward(c.hooks) {
		if op.hookMark(h.Name(), HookBeforeCommit) == "" || !due(HookRestore, op.hookMark(h.Name(), HookRestore)) {
			continue
		}
		if err := c.callHook(op, h, HookRestore, h.Restore); err != nil {
			op.addHookError(fmt.Errorf("%w: what its before-commit changed may still be in place", err))
		}
	}
}

// addHookError records an error that does not change the outcome; it is
// added to the report's error when the run ends.
func (op *operation) addHookError(err error) {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.hookErrs = append(op.hookErrs, err)
}

// takeHookErrors joins and clears the run's hook errors, for the report.
func (op *operation) takeHookErrors() string {
	op.mu.Lock()
	defer op.mu.Unlock()
	err := errors.Join(op.hookErrs...)
	op.hookErrs = nil
	if err == nil {
		return ""
	}
	return err.Error()
}

// completesPrepare reports whether feeding ev to the core would complete
// the prepare barrier with every agent prepared: the core would then send
// Commit, and BeforeCommit must run first. It reads the core without
// changing it (only the driving goroutine calls it).
func (op *operation) completesPrepare(ev barrier.Event) bool {
	r, ok := ev.(barrier.Reply)
	if !ok || !r.OK || r.Step != barrier.Prepare || op.core.Phase() != barrier.Prepare || r.Attempt != op.core.Attempt() || op.rollbackAsked {
		return false
	}
	for _, n := range op.core.Nodes() {
		h := op.core.History(n)
		if len(h) == 0 || h[len(h)-1].Step != barrier.Prepare {
			return false
		}
		st := h[len(h)-1].Status
		if n == r.Node {
			if st != barrier.StatusPending {
				return false // a duplicate: the core ignores it
			}
		} else if st != barrier.StatusOK {
			return false
		}
	}
	return true
}

// preflightHooks asks every hook for problems; each is prefixed with the
// hook's name.
func (c *Coordinator) preflightHooks(ctx context.Context, info OpInfo) []string {
	var out []string
	for _, h := range c.hooks {
		for _, p := range h.Preflight(ctx, info) {
			out = append(out, h.Name()+": "+p)
		}
	}
	return out
}

// fullPreflight is the agents' preflight plus the hooks': the cutover,
// the dry run and Plan all judge by it.
func (c *Coordinator) fullPreflight(ctx context.Context, r request, kind string) *preflight {
	pf := c.runPreflight(ctx, r)
	if len(c.hooks) == 0 {
		return pf
	}
	probs := c.preflightHooks(ctx, OpInfo{ID: r.id, Kind: kind, FromPort: pf.from, ToPort: r.to, Nodes: slices.Clone(r.nodes)})
	pf.problems = append(pf.problems, probs...)
	pf.resp.Problems = pf.problems
	return pf
}
