// Package preflight judges a request before anything changes (I3): it
// validates a CutoverRequest against the inventory (Validate: every error
// InvalidArgument, naming the field, the value and why), settles strategy
// "auto" (ResolveAuto: the agents' one round of Preflight calls, which
// Full then reads instead of asking again), and asks every targeted
// agent and every hook whether the change may go (Full): the agents' own
// checks and clock offsets, the overlays a subset would split, the
// underlay path check (PathCheck; the verdicts are internal/pathjudge's)
// and the probe mesh the operation will verify with (PlanProbes).
//
// A Checker calls agents and hooks but changes nothing and keeps no
// operation: the coordinator runs the operation from the Request and the
// Result it returns.
//
//	checker.go    Checker; the agents' preflight plus the hooks' (Full)
//	preflight.go  Request and Validate; Result and the agents' preflight
//	auto.go       strategy auto: staged or atomic, and why
//	overlays.go   what a subset leaves behind in its overlays
//	pathcheck.go  the underlay path check: its rounds of agent calls
//	probeplan.go  the probe mesh of the operation
package preflight
