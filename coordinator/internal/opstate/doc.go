// Package opstate is one operation's bookkeeping: the journal record
// (model.Record) and the report the operator reads, the events a stream
// follows, the timeline of each node's instants, the late commits and
// the staged batches as they pass, the held operation's nodes, and the
// text the report tells about them. An Op's fields are touched by the
// runner's one driving goroutine or under Mu, as each field says.
//
// It calls no agent and writes no journal: the coordinator's runner does,
// and feeds what it learns in here.
//
//	op.go        Op: record, report, events, results; the journaled report
//	timeline.go  each node's instants, read back after the run
//	late.go      late commits and the spread of the instants
//	held.go      staged batches and the held operation's nodes
//	report.go    what the report says of a failed operation's nodes
package opstate
