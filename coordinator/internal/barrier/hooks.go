package barrier

import (
	"fmt"
	"slices"
)

// hookKey names one hook call, a hook at a point: what Op.marks journals.
type hookKey struct {
	hook  string
	point HookPoint
}

// due says whether a hook call at point must be made given its journaled
// state. BeforeCommit is never repeated: once started it may have acted,
// and the operation is undone (Restore) instead. AfterConfirm and Finalize
// run after the dataplane is verified good: one that a restart
// interrupted (started, never finished) is made again, so the source of
// truth converges; one that finished (done or failed) is not. Restore is
// made again until it succeeds (it puts a state back: repeating it is
// harmless, skipping it is not).
func due(point HookPoint, state HookState) bool {
	switch point {
	case HookBeforeCommit:
		return state == ""
	case HookAfterConfirm, HookFinalize:
		return state == "" || state == MarkStarted
	default: // restore
		return state != MarkDone
	}
}

// callHooks starts the hook calls due at point, one at a time; with none
// due it goes on at once.
func (o *Op) callHooks(point HookPoint) []Action {
	hooks := o.cfg.Hooks
	if point == HookRestore {
		hooks = slices.Clone(hooks)
		slices.Reverse(hooks)
	}
	o.hookQueue = nil
	for _, h := range hooks {
		if point == HookRestore && o.marks[hookKey{h, HookBeforeCommit}] == "" {
			continue // its BeforeCommit never started: nothing to put back
		}
		if due(point, o.marks[hookKey{h, point}]) {
			o.hookQueue = append(o.hookQueue, h)
		}
	}
	if len(o.hookQueue) == 0 {
		return o.hooksDone(point)
	}
	o.stage, o.hookPoint = stageHooks, point
	return o.callNextHook()
}

func (o *Op) callNextHook() []Action {
	h := o.hookQueue[0]
	o.marks[hookKey{h, o.hookPoint}] = MarkStarted
	return []Action{CallHook{Hook: h, Point: o.hookPoint, Timeout: o.cfg.StepTimeout, JournalFirst: o.hookPoint == HookBeforeCommit}}
}

func (o *Op) hookDone(e HookDone) []Action {
	if o.stage != stageHooks || e.Point != o.hookPoint || len(o.hookQueue) == 0 || e.Hook != o.hookQueue[0] {
		return nil // not the call in flight: a duplicate or a stray
	}
	k := hookKey{e.Hook, e.Point}
	o.hookQueue = o.hookQueue[1:]
	if e.Err == "" {
		o.marks[k] = MarkDone
	} else {
		o.marks[k] = MarkFailed
		switch e.Point {
		case HookBeforeCommit:
			// Nothing has flipped: abort, and skip the other hooks.
			o.failed = true
			if o.reason == "" {
				o.reason = fmt.Sprintf("%s failed: %s", Prepare, e.Err)
			}
			o.hookQueue = nil
		case HookRestore:
			o.notes = append(o.notes, e.Err+": what its before-commit changed may still be in place")
		default:
			o.notes = append(o.notes, e.Err)
		}
	}
	if len(o.hookQueue) > 0 {
		return o.callNextHook()
	}
	o.stage = stageBarrier
	return o.hooksDone(e.Point)
}

// hooksDone goes on once every hook call at point was made.
func (o *Op) hooksDone(point HookPoint) []Action {
	switch point {
	case HookBeforeCommit, HookAfterConfirm:
		// After AfterConfirm, Finalize goes out even if a rollback was
		// asked meanwhile: the finalize barrier takes the request.
		if point == HookAfterConfirm {
			return o.send(Finalize, o.cfg.Nodes)
		}
		if o.staged() && !o.failed && o.rollbackReq == "" {
			// Staged: BeforeCommit ran after the last batch confirmed.
			return o.callHooks(HookAfterConfirm)
		}
		return o.proceed()
	case HookFinalize:
		return o.succeed()
	default:
		return o.finish(o.ending)
	}
}
