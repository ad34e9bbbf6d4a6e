// Package fleet is the coordinator's side of its agents: the inventory as
// last read (Refresh re-reads a cluster's), one lazily dialled client per
// agent over one call stream (Agent; a node outside the inventory gets a
// client whose calls fail saying so), the agents' clock offsets
// (MeasureClock, bounded so that a sample measures the network and not
// the coordinator's own queue), the fan-out that calls many agents at
// once (FanOut) and the warming of connections before the first
// operation (Warm).
//
// It decides nothing about an operation: which agents to call, with
// what, is the runner's.
package fleet
