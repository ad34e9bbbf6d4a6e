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
//	op.go        Op: the record, events and their followers, the journaled
//	             report
//	report.go    the report and the node results: their one writer (what
//	             happened, told through its methods) and their copies;
//	             TestReportHasOneWriter holds every other file to it
//	timeline.go  the report's event log, clocks
//	held.go      the held operation's nodes, for messages and refusals
//	failed.go    what the report says of a failed operation's nodes
package opstate
