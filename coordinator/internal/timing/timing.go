// Package timing holds the coordinator's decisions about time that the
// barrier core cannot make (it has no clock): how far ahead the commit
// instant is set and how long an agent's dead-man waits (a staged step's
// bounds are staging.Bounds). It is pure: figures in, durations
// out; the runner measures and applies.
package timing

import (
	"slices"
	"time"
)

// Lead configures the commit lead (the coordinator's --commit-lead-*
// flags).
type Lead struct {
	Min      time.Duration // never less ahead than this
	RTTx     int           // at least this many times the worst round trip
	PerAgent time.Duration // an allowance per agent (0 by default)
}

// Round is what the prepare round just before the commit measured.
type Round struct {
	Nodes   int
	MaxRTT  time.Duration   // the worst clock-sample round trip to an agent
	Prepare time.Duration   // the prepare step, first send to last answer
	Answers []time.Duration // each Prepare answer, from the round's start
}

// CommitLead is how far ahead the commit instant is set: enough for every
// Commit call to arrive before it. The worst single round trip is not
// enough with many agents: sending N calls costs time of its own (CPU,
// connection writes). The prepare round just before is the best measure
// of that cost (the same agents, the same fan-out of one call each), plus
// the per-agent allowance. The report's commit margin
// (commit_margin_nanos: the instant minus the last Commit's arrival)
// shows what the lead left (docs/benchmarks.md).
//
// The round's fan-out is at most twice its median answer: the calls go out
// one after another, so the answers spread over the time the fan-out took
// and half of them are in by half of it, while the last answer also waits
// for the slowest agent's own work. A node frozen through its Prepare made
// the whole round, and so the lead, 10.7 s where the median answer came
// in milliseconds. Where the answers bunch up late instead (10,000
// simulated agents: twice the median was 1.6× the round) the round
// stands. Without answers (a coordinator resumed past prepare) the round
// stands too.
//
// A quarter more on top: the commit fan-out is as long as the prepare
// fan-out give or take the noise. Without it the Commit calls arrived
// 43-70 ms before the instant at 1,000 simulated agents and 92-189 ms at
// 10,000 (make bench-coordinator-ab), too close for a machine's noise.
func CommitLead(l Lead, r Round) time.Duration {
	prep := r.Prepare
	if n := len(r.Answers); n > 0 {
		a := slices.Clone(r.Answers)
		slices.Sort(a)
		prep = min(prep, 2*a[n/2])
	}
	prep += prep / 4
	return l.Min + max(time.Duration(l.RTTx)*r.MaxRTT, prep) + time.Duration(r.Nodes)*l.PerAgent
}

// Deadman is the dead-man duration sent with the commit of an operation
// whose steps last step: the configured one, never shorter than three
// steps, so that verify and confirm fit before the agents revert by
// themselves.
func Deadman(configured, step time.Duration) time.Duration {
	return max(configured, 3*step)
}
