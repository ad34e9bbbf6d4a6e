// Package model is the coordinator's vocabulary: the inventory of agents
// (AgentSpec, Inventory and their parsing), the hooks an integration plugs
// in (Hook, Planner, NextStepper, OpInfo, HookMark), the post-commit
// Verifier, and the journal's Record with the JournalStore that keeps it
// and the pruning rule (Prunable) every journal shares.
//
// It sits below everything else in coordinator/ but the barrier core, so
// that the runner, the decision packages and the public coordinator
// package (which re-exports these names as aliases) can all speak it
// without importing each other. It holds data and its validation only: no
// I/O beyond reading an inventory file, no clock, no goroutine.
package model
