package coordinator

import (
	"slices"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
)

// coreConfig is the barrier core's configuration of an operation over
// nodes. An abort or rollback retries an unreached agent with back-off for
// the dead-man duration and a second: an agent that is restarting is
// reached when it is back, and one that stays unreachable has by then
// reverted a commit by itself (I4); a prepare it aborts at its own
// (longer) prepare deadline, which the Failed report names. marks are the
// hook calls journaled by an earlier run: the core decides from them which
// hook calls are due.
func (c *Coordinator) coreConfig(nodes []string, step, deadman time.Duration, marks []HookMark, batches [][]string) barrier.Config {
	cfg := barrier.Config{Nodes: nodes, Batches: batches, StepTimeout: step, RollbackAttempts: c.cfg.RollbackAttempts,
		RetryBackoff: c.cfg.RollbackBackoff, RetryBackoffMax: 8 * c.cfg.RollbackBackoff, RetryFor: deadman + time.Second,
		// The built-in probe mesh verifier (internal/probes), and the
		// operation-wide one when given.
		Verifier: c.verifier != nil || !c.cfg.NoProbeVerify,
		// Agents without peers report no counters: harmless.
		Probes: true}
	if c.cfg.LatePolicy == LateRollback && len(batches) == 0 {
		// Under the wait policy late nodes are reported, not judged.
		cfg.LateBudget = c.cfg.LateBudget
	}
	for _, h := range c.hooks {
		cfg.Hooks = append(cfg.Hooks, h.Name())
	}
	for _, m := range marks {
		cfg.HookMarks = append(cfg.HookMarks, barrier.HookMark{Hook: m.Hook, Point: barrier.HookPoint(m.Point), State: barrier.HookState(m.State)})
	}
	return cfg
}

// deadmanFor is the dead-man duration sent with the commit of an operation
// whose steps last step: never shorter than three steps, so that verify
// and confirm fit before the agents revert by themselves.
func (c *Coordinator) deadmanFor(step time.Duration) time.Duration {
	return max(c.cfg.Deadman, 3*step)
}

// commitLead is how far ahead the commit instant is set: enough for every
// Commit call to arrive before it. The worst single round trip is not
// enough with many agents: sending N calls costs time of its own (CPU,
// connection writes). The prepare round just before is the best measure
// of that cost (the same agents, the same fan-out of one call each), plus
// a configurable per-agent allowance (0 by default). The report's commit
// margin (commit_margin_nanos: the instant minus the last Commit's
// arrival) shows what the lead left (docs/benchmarks.md).
//
// The round's fan-out is at most twice its median answer: the calls go out
// one after another, so the answers spread over the time the fan-out took
// and half of them are in by half of it, while the last answer also waits
// for the slowest agent's own work. A node frozen through its Prepare made
// the whole round, and so the lead, 10.7 s in a CI run
// (TestSecondOperationRefused), where the median answer came in
// milliseconds. Where the answers bunch up late instead (10,000 simulated
// agents: twice the median was 1.6× the round) the round stands. Without
// answers (a coordinator resumed past prepare) the round stands too.
//
// A quarter more on top: the commit fan-out is as long as the prepare
// fan-out give or take the noise. The prepare round used to carry a
// second fan-out beside it (the probe counters' reset, now riding in
// Prepare) that made it longer; without it, the Commit calls arrived
// 43-70 ms before the instant at 1,000 simulated agents and 92-189 ms at
// 10,000 (make bench-coordinator-ab), too close for a machine's noise.
func (c *Coordinator) commitLead(op *opstate.Op) time.Duration {
	var maxRTT time.Duration
	for _, s := range op.Offsets {
		maxRTT = max(maxRTT, s.RTT)
	}
	op.Mu.Lock()
	prep := op.PrepDur
	if n := len(op.PrepAnswers); n > 0 {
		a := slices.Clone(op.PrepAnswers)
		slices.Sort(a)
		prep = min(prep, 2*a[n/2])
	}
	op.Mu.Unlock()
	prep += prep / 4
	return c.cfg.CommitLeadMin + max(time.Duration(c.cfg.CommitLeadRTTx)*maxRTT, prep) + time.Duration(len(op.Nodes))*c.cfg.CommitLeadPerAgt
}
