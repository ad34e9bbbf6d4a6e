package coordinator

import (
	"context"
	"fmt"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
)

// Hook points, as journaled in Record.Hooks: the core's names.
const (
	HookBeforeCommit = string(barrier.HookBeforeCommit)
	HookAfterConfirm = string(barrier.HookAfterConfirm)
	HookFinalize     = string(barrier.HookFinalize)
	HookRestore      = string(barrier.HookRestore)
)

// States of a journaled hook call: the core's names.
const (
	HookStarted = string(barrier.MarkStarted) // journaled before the call: it may have acted
	HookDone    = string(barrier.MarkDone)
	HookFailed  = string(barrier.MarkFailed)
)

// callHook makes one journaled hook call, as the core asked: marked
// started in the journal before the call (it may act) and done or failed
// after it. It returns the event for the core.
func (c *Coordinator) callHook(op *opstate.Op, a barrier.CallHook) barrier.Event {
	name, point := a.Hook, string(a.Point)
	done := barrier.HookDone{Hook: a.Hook, Point: a.Point}
	h := c.hookNamed(name)
	if h == nil {
		// The core names only hooks of its Config, built from c.hooks.
		done.Err = fmt.Sprintf("hook %s %s: no such hook", name, point)
		return done
	}
	op.SetHookMark(HookMark{Hook: name, Point: point, State: HookStarted})
	if err := c.save(op); err != nil && a.JournalFirst {
		op.SetHookMark(HookMark{Hook: name, Point: point, State: HookFailed, Error: "not journaled: " + err.Error()})
		done.Err = fmt.Sprintf("hook %s %s: not called, the journal refused the write: %v", name, point, err)
		return done
	}
	f := map[barrier.HookPoint]func(context.Context, OpInfo) error{
		barrier.HookBeforeCommit: h.BeforeCommit, barrier.HookAfterConfirm: h.AfterConfirm,
		barrier.HookFinalize: h.Finalize, barrier.HookRestore: h.Restore,
	}[a.Point]
	ctx, cancel := context.WithTimeout(c.ctx, a.Timeout)
	err := f(ctx, op.Info())
	cancel()
	m := HookMark{Hook: name, Point: point, State: HookDone}
	if err != nil {
		m.State, m.Error = HookFailed, err.Error()
		err = fmt.Errorf("hook %s %s: %w", name, point, err)
		done.Err = err.Error()
		op.Emit(point, "", err.Error(), true, nil)
		c.log.Error("hook", "operation", op.Rec.ID, "hook", name, "point", point, "err", err)
	} else {
		op.Emit(point, "", fmt.Sprintf("hook %s %s: ok", name, point), false, nil)
	}
	op.SetHookMark(m)
	// A done or failed mark the journal cannot take leaves "started"
	// there: a later run then restores the hook, the safe direction.
	// writeRecord tells the followers.
	_ = c.save(op)
	return done
}

func (c *Coordinator) hookNamed(name string) Hook {
	for _, h := range c.hooks {
		if h.Name() == name {
			return h
		}
	}
	return nil
}

// nextSteps is what the hooks leave the admin after op succeeded.
func (c *Coordinator) nextSteps(info OpInfo) []string {
	var out []string
	for _, h := range c.hooks {
		if n, ok := h.(NextStepper); ok {
			for _, l := range n.NextSteps(info) {
				out = append(out, h.Name()+": "+l)
			}
		}
	}
	return out
}
