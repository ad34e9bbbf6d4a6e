package barrier

import "slices"

// staged reports whether the operation switches its senders in batches.
func (o *Op) staged() bool { return len(o.cfg.Batches) > 0 }

// holds reports whether a staged operation leaves some node sending the
// old port once its batches are confirmed: a node in no batch and not
// Switched by an earlier run.
func (o *Op) holds() bool {
	if !o.staged() {
		return false
	}
	return len(o.Sending()) < len(o.cfg.Nodes) // both are sets of cfg.Nodes
}

// Sending is, once a staged operation ended Held, the nodes that send the
// new port: Switched and every batch's, sorted, each once.
func (o *Op) Sending() []string {
	var out []string
	out = append(out, o.cfg.Switched...)
	for _, b := range o.cfg.Batches {
		out = append(out, b...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// rollbackStep is how an operation that sent Commit is undone: staged
// ones switch every sender back before anyone stops listening.
func (o *Op) rollbackStep() Step {
	if o.staged() {
		return Unswitch
	}
	return Rollback
}

// batchNumber is the 1-based staged batch a step is for, 0 when none.
func (o *Op) batchNumber(step Step) int {
	if !o.staged() || (step != Commit && step != Verify && step != Confirm) {
		return 0
	}
	return o.batch + 1
}

// Batch is the staged batch (1-based) in flight or last run; 0 for an
// atomic operation or before the first Commit.
func (o *Op) Batch() int {
	if !o.staged() || !o.sentCommit {
		return 0
	}
	return o.batch + 1
}
