package runner

import (
	"context"
	"fmt"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
)

// callHook makes one journaled hook call, as the core asked: marked
// started in the journal before the call (it may act) and done or failed
// after it. It returns the event for the core.
func (rn *Runner) callHook(op *opstate.Op, a barrier.CallHook) barrier.Event {
	name, point := a.Hook, string(a.Point)
	done := barrier.HookDone{Hook: a.Hook, Point: a.Point}
	h := rn.hookNamed(name)
	if h == nil {
		// The core names only hooks of its Config, built from rn.Hooks.
		done.Err = fmt.Sprintf("hook %s %s: no such hook", name, point)
		return done
	}
	op.SetHookMark(model.HookMark{Hook: name, Point: point, State: string(barrier.MarkStarted)})
	if err := rn.Journal.Save(op); err != nil && a.JournalFirst {
		op.SetHookMark(model.HookMark{Hook: name, Point: point, State: string(barrier.MarkFailed), Error: "not journaled: " + err.Error()})
		done.Err = fmt.Sprintf("hook %s %s: not called, the journal refused the write: %v", name, point, err)
		return done
	}
	f := map[barrier.HookPoint]func(context.Context, model.OpInfo) error{
		barrier.HookBeforeCommit: h.BeforeCommit, barrier.HookAfterConfirm: h.AfterConfirm,
		barrier.HookFinalize: h.Finalize, barrier.HookRestore: h.Restore,
	}[a.Point]
	ctx, cancel := context.WithTimeout(rn.Ctx, a.Timeout)
	err := f(ctx, op.Info())
	cancel()
	m := model.HookMark{Hook: name, Point: point, State: string(barrier.MarkDone)}
	if err != nil {
		m.State, m.Error = string(barrier.MarkFailed), err.Error()
		err = fmt.Errorf("hook %s %s: %w", name, point, err)
		done.Err = err.Error()
		op.Emit(point, "", err.Error(), true, nil)
		rn.Log.Error("hook", "operation", op.Rec.ID, "hook", name, "point", point, "err", err)
	} else {
		op.Emit(point, "", fmt.Sprintf("hook %s %s: ok", name, point), false, nil)
	}
	op.SetHookMark(m)
	// A done or failed mark the journal cannot take leaves "started"
	// there: a later run then restores the hook, the safe direction.
	// writeRecord tells the followers.
	_ = rn.Journal.Save(op)
	return done
}

func (rn *Runner) hookNamed(name string) model.Hook {
	for _, h := range rn.Hooks {
		if h.Name() == name {
			return h
		}
	}
	return nil
}

// nextSteps is what the hooks leave the admin after op succeeded.
func (rn *Runner) nextSteps(info model.OpInfo) []string {
	var out []string
	for _, h := range rn.Hooks {
		if n, ok := h.(model.NextStepper); ok {
			for _, l := range n.NextSteps(info) {
				out = append(out, h.Name()+": "+l)
			}
		}
	}
	return out
}
