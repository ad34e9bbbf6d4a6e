// Package runner runs one operation at a time: it performs the barrier
// core's actions (internal/barrier) and feeds their results back as
// events. It decides nothing: what happens next, in which order, and
// what a failure leads to is the core's (and, for what needs a clock or a
// figure, internal/timing's and internal/staging's). It calls the agents,
// the hooks and the verifier, writes the journal through the
// coordinator's Journal, keeps the operation's bookkeeping (opstate) and
// metrics, and hands the operation back through Slot when its run ends.
//
//	runner.go      Runner, Launch and the event loop: core actions → calls → core events
//	agentcalls.go  one step as parallel agent RPCs; the commit's spreads
//	late.go        late commits: the answers' watch
//	hooks.go       hook calls and their journal marks; the hooks' next steps
//	nodes.go       what the report and the followers are told of a node's answer
//	timing.go      the core's Config; the figures timing.CommitLead decides from
//	faultinject.go, faultinject_off.go
//	               the bite tests' switch (tag cutover_faultinject)
package runner
