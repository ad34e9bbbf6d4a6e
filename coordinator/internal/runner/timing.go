package runner

import (
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/timing"
)

// CoreConfig is the barrier core's configuration of an operation over
// nodes. An abort or rollback retries an unreached agent with back-off for
// the dead-man duration and a second: an agent that is restarting is
// reached when it is back, and one that stays unreachable has by then
// reverted a commit by itself (I4); a prepare it aborts at its own
// (longer) prepare deadline, which the Failed report names. marks are the
// hook calls journaled by an earlier run: the core decides from them which
// hook calls are due.
func (rn *Runner) CoreConfig(nodes []string, step, deadman time.Duration, marks []model.HookMark, batches [][]string) barrier.Config {
	cfg := barrier.Config{Nodes: nodes, Batches: batches, StepTimeout: step, RollbackAttempts: rn.Cfg.RollbackAttempts,
		RetryBackoff: rn.Cfg.RollbackBackoff, RetryBackoffMax: 8 * rn.Cfg.RollbackBackoff, RetryFor: deadman + time.Second,
		// The built-in probe mesh verifier (internal/probes), and the
		// operation-wide one when given.
		Verifier: rn.Verifier != nil || !rn.Cfg.NoProbeVerify,
		// Agents without peers report no counters: harmless.
		Probes: true}
	if len(batches) == 0 {
		// The core judges late nodes by the policy: under wait they are
		// reported, never undone for.
		cfg.LateBudget, cfg.LateWait = rn.Cfg.LateBudget, rn.Cfg.LatePolicy != config.LateRollback
	}
	for _, h := range rn.Hooks {
		cfg.Hooks = append(cfg.Hooks, h.Name())
	}
	for _, m := range marks {
		cfg.HookMarks = append(cfg.HookMarks, barrier.HookMark{Hook: m.Hook, Point: barrier.HookPoint(m.Point), State: barrier.HookState(m.State)})
	}
	return cfg
}

// DeadmanFor is the dead-man duration sent with the commit of an operation
// whose steps last step (timing.Deadman).
func (rn *Runner) DeadmanFor(step time.Duration) time.Duration {
	return timing.Deadman(rn.Cfg.Deadman, step)
}

// commitLead is how far ahead op's commit instant is set, from the prepare
// round just measured (timing.CommitLead).
func (rn *Runner) commitLead(op *opstate.Op) time.Duration {
	r := timing.Round{Nodes: len(op.Nodes)}
	for _, s := range op.Offsets {
		r.MaxRTT = max(r.MaxRTT, s.RTT)
	}
	lead := timing.Lead{Min: rn.Cfg.CommitLeadMin, RTTx: rn.Cfg.CommitLeadRTTx, PerAgent: rn.Cfg.CommitLeadPerAgt}
	op.Mu.Lock()
	defer op.Mu.Unlock()
	// CommitLead sorts a copy of its own: the answers are read in place.
	r.Prepare, r.Answers = op.PrepDur, op.PrepAnswers
	return timing.CommitLead(lead, r)
}
