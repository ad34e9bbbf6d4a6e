package opstate

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/staging"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The report (coordinatorv1.Report, with a NodeResult per node) is one
// projection of what happened to an operation, and this file is its one
// writer: op.report and op.results are written nowhere else. The runner,
// the service and the probe calls tell the operation what happened
// (Begin, Preflighted, EndPhaseLocked, NoteCommit, EndCommit, Declared,
// ...) and read copies (Snapshot).

// startReport starts an operation's report: running, one result per
// node.
func (op *Op) startReport(id string, from, to tunnelport.Port, nodes []string) {
	op.report = &coordinatorv1.Report{OperationId: id, State: coordinatorv1.OperationState_OPERATION_STATE_RUNNING,
		FromPort: from.Wire(), ToPort: to.Wire(), StartedUnixNano: time.Now().UnixNano()}
	op.results = make(map[string]*coordinatorv1.NodeResult, len(nodes))
	for _, n := range nodes {
		op.results[n] = &coordinatorv1.NodeResult{Node: n}
	}
}

// Snapshot returns a copy of the report with the node results, in node order.
func (op *Op) Snapshot() *coordinatorv1.Report {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	return op.SnapshotLocked()
}

func (op *Op) SnapshotLocked() *coordinatorv1.Report {
	r := proto.Clone(op.report).(*coordinatorv1.Report)
	r.Events = op.eventsLocked()
	if !op.CommitAt.IsZero() {
		r.CommitUnixNano = op.CommitAt.UnixNano()
	}
	r.Nodes = nil
	for _, n := range op.Nodes {
		r.Nodes = append(r.Nodes, proto.Clone(op.results[n]).(*coordinatorv1.NodeResult))
	}
	return r
}

// Strategy is the operation's strategy (Report.strategy).
func (op *Op) Strategy() string {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	return op.report.GetStrategy()
}

// Reverts is the operation a rollback reverses ("" for a cutover).
func (op *Op) Reverts() string {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	return op.report.GetRevertsOperationId()
}

// FlipsLocked is, by node, when its Commit took effect in the
// coordinator's clock (applied plus the apply's own time; 0: not
// applied) and its clock offset as first measured. op.Mu is held.
func (op *Op) FlipsLocked() map[string][2]int64 {
	out := make(map[string][2]int64, len(op.results))
	for n, r := range op.results {
		var flipped int64
		if r.AppliedUnixNano != 0 {
			flipped = r.AppliedUnixNano + r.ApplyNanos
		}
		out[n] = [2]int64{flipped, r.ClockOffsetNanos}
	}
	return out
}

// Beginning is what an operation is, as it is created.
type Beginning struct {
	Kind           string // "cutover" or "rollback"
	Reverts        string // the operation a rollback reverses
	Strategy       string
	StrategyReason string
	Batches        [][]string // staged
	MaxParallel    int        // staged
}

// Begin records what the operation is.
func (op *Op) Begin(b Beginning) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	r := op.report
	r.Kind, r.RevertsOperationId = b.Kind, b.Reverts
	r.Strategy, r.StrategyReason = b.Strategy, b.StrategyReason
	if len(b.Batches) > 0 {
		r.Batches = staging.ReportBatches(b.Batches)
		r.MaxParallel = uint32(b.MaxParallel)
	}
}

// Preflight is what the preflight that admitted the operation found.
type Preflight struct {
	From        tunnelport.Port
	RequestedBy string
	Request     *coordinatorv1.CutoverRequest
	Plan        *coordinatorv1.PlanResponse
	Started     time.Time
	Took        time.Duration
	Warnings    []string // accepted problems (path check, probe mesh): they flag the result
	Clocks      map[string]fleet.ClockSample
}

// Preflighted records the admitting preflight: the port the nodes are on,
// who asked for what, the plan, the preflight phase, its warnings and the
// agents' clocks (op.Offsets too).
func (op *Op) Preflighted(p Preflight) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	r := op.report
	op.From, op.Rec.FromPort, r.FromPort = p.From, p.From, p.From.Wire()
	r.RequestedBy = p.RequestedBy
	r.Request = proto.Clone(p.Request).(*coordinatorv1.CutoverRequest)
	r.Plan = p.Plan
	r.Phases = append(r.Phases, &coordinatorv1.PhaseDuration{Phase: "preflight", Nanos: p.Took.Nanoseconds(), StartedUnixNano: p.Started.UnixNano()})
	r.Warnings = append(r.Warnings, p.Warnings...)
	for n, s := range p.Clocks {
		op.Offsets[n] = s
		if nr := op.results[n]; nr != nil {
			nr.ClockOffsetNanos = s.Offset.Nanoseconds()
		}
	}
}

// Restore takes the report an earlier run journaled (a restarted
// coordinator): its node results, and its events as the prior ones (the
// report's log keeps them; followers are not replayed them).
func (op *Op) Restore(journaled []byte) error {
	if len(journaled) == 0 {
		return nil
	}
	op.Mu.Lock()
	defer op.Mu.Unlock()
	if err := protojson.Unmarshal(journaled, op.report); err != nil {
		return err
	}
	for _, nr := range op.report.Nodes {
		op.results[nr.Node] = nr
	}
	op.PriorEvents, op.report.Events = op.report.Events, nil
	return nil
}

// ContinueBatches adds a held operation's next run's batches: the core
// numbers them from 1, the report after the earlier runs' (BatchBase).
func (op *Op) ContinueBatches(batches [][]string, maxParallel int) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	op.BatchBase = len(op.report.Batches)
	op.report.Batches = append(op.report.Batches, staging.ReportBatches(batches)...)
	op.report.MaxParallel = uint32(maxParallel)
}

// EndPhaseLocked records that phase lasted d, ending at now. op.Mu is
// held.
func (op *Op) EndPhaseLocked(phase barrier.Step, d time.Duration, now time.Time) {
	op.report.Phases = append(op.report.Phases, &coordinatorv1.PhaseDuration{Phase: string(phase), Nanos: d.Nanoseconds(), StartedUnixNano: now.Add(-d).UnixNano()})
}

// NoteLatePolicy records the policy a Commit send runs under.
func (op *Op) NoteLatePolicy(budget time.Duration, policy string) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	op.report.LateBudgetNanos, op.report.LatePolicy = budget.Nanoseconds(), policy
}

// CommitAnswer is one node's Commit answer, in the coordinator's clock
// (0: not measured).
type CommitAnswer struct {
	Applied        int64 // the agent's wake-up at the instant
	ApplyNanos     int64 // how long its apply took
	Written        int64 // the write leaving for the dataplane
	Effective      int64 // the dataplane's confirmation
	Received       int64 // the Commit's arrival at the agent
	AnswerSent     int64
	AnswerReceived int64
	ApplyToAnswer  int64 // the agent's own measure: apply to answer
}

// NoteCommit records node's Commit answer in its result and in the
// figures the commit's spreads are computed from.
func (op *Op) NoteCommit(node string, a CommitAnswer) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	if nr := op.results[node]; nr != nil {
		nr.AppliedUnixNano, nr.ApplyNanos = a.Applied, a.ApplyNanos
		nr.WrittenUnixNano, nr.EffectiveUnixNano = a.Written, a.Effective
		nr.CommitReceivedUnixNano = a.Received
		nr.AnswerSentUnixNano, nr.AnswerReceivedUnixNano = a.AnswerSent, a.AnswerReceived
		nr.ApplyToAnswerNanos = a.ApplyToAnswer
	}
	op.Applied[node] = a.Applied
	if a.Received != 0 {
		op.LastArrival = max(op.LastArrival, a.Received)
	}
	if a.Written != 0 {
		op.Written[node] = a.Written
	}
	if a.Effective != 0 {
		op.Effective[node] = a.Effective
	}
}

// Spreads are an atomic commit's figures: of the wake-ups (commit
// spread), of the writes leaving for the dataplanes, of their effects,
// and the margin the lead left (the instant minus the last Commit's
// arrival). Has* say which were measured.
type Spreads struct {
	Commit, Write, Effect, Margin             time.Duration
	HasCommit, HasWrite, HasEffect, HasMargin bool
}

// EndCommit sets the report's spreads once every Commit call of an atomic
// send returned, and returns them (for the metrics). The effect spread is
// what the overlay saw; the wake-up spread alone hid the time a busy
// ovsdb-server or kernel took after it.
func (op *Op) EndCommit() Spreads {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	spread := func(m map[string]int64) (time.Duration, bool) {
		if len(m) == 0 {
			return 0, false
		}
		lo, hi := int64(1<<63-1), int64(-1<<63)
		for _, t := range m {
			lo, hi = min(lo, t), max(hi, t)
		}
		return time.Duration(hi - lo), true
	}
	var s Spreads
	if s.Commit, s.HasCommit = spread(op.Applied); s.HasCommit {
		op.report.CommitSpreadNanos = s.Commit.Nanoseconds()
	}
	if s.Write, s.HasWrite = spread(op.Written); s.HasWrite {
		op.report.WriteSpreadNanos = s.Write.Nanoseconds()
	}
	if s.Effect, s.HasEffect = spread(op.Effective); s.HasEffect {
		op.report.EffectSpreadNanos = s.Effect.Nanoseconds()
	}
	if op.LastArrival != 0 && !op.CommitAt.IsZero() {
		s.Margin, s.HasMargin = time.Duration(op.CommitAt.UnixNano()-op.LastArrival), true
		op.report.CommitMarginNanos = s.Margin.Nanoseconds()
	}
	return s
}

// NoteLate records (or updates) a late node in the report.
func (op *Op) NoteLate(n string, lateness int64, applied bool) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	for _, l := range op.report.LateNodes {
		if l.Node == n {
			l.LatenessNanos, l.Applied = lateness, applied
			return
		}
	}
	op.report.LateNodes = append(op.report.LateNodes, &coordinatorv1.LateNode{Node: n, LatenessNanos: lateness, Applied: applied})
	sort.Slice(op.report.LateNodes, func(i, j int) bool { return op.report.LateNodes[i].Node < op.report.LateNodes[j].Node })
}

// NoteNodeError adds msg to node's error: a failed answer, or a retry
// that reached it (reached: only said next to the failed attempts before
// it). A retry failing the same way is said once, "(again)".
func (op *Op) NoteNodeError(node, msg string, reached bool) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	r := op.results[node]
	switch {
	case r == nil:
	case reached:
		if r.Error != "" {
			r.Error += "; " + msg
		}
	case r.Error == "":
		r.Error = msg
	case strings.HasSuffix(r.Error, msg) || strings.HasSuffix(r.Error, msg+" (again)"):
		r.Error = strings.TrimSuffix(r.Error, " (again)") + " (again)"
	default:
		r.Error += "; " + msg
	}
}

// NoteTimeline records in node's result when a step's answer shows the
// node got there (coordinator clock). st is the agent's status when the
// answer carried one. Recorded as the run goes, so a report of a running,
// aborted or rolled-back operation has it too.
func (op *Op) NoteTimeline(node string, s barrier.Send, ev barrier.Event, st *agentv1.OperationStatus) {
	r, ok := ev.(barrier.Reply)
	if !ok || !r.OK {
		return
	}
	now := time.Now().UnixNano()
	op.Mu.Lock()
	defer op.Mu.Unlock()
	nr := op.results[node]
	if nr == nil {
		return
	}
	switch s.Step {
	case barrier.Prepare:
		nr.PreparedUnixNano = now
	case barrier.Confirm:
		nr.ConfirmedUnixNano = now
	case barrier.Finalize:
		nr.FinalizedUnixNano = now
	case barrier.Abort, barrier.Rollback:
		noteReverted(nr, string(s.Step), now, st, op.Offsets[node].Offset.Nanoseconds())
	}
}

// noteReverted marks nr undone, by what the agent says undid it when it
// says so (its dead-man, its prepare timeout), at the instant it did, else
// by step at now. A node that never saw the operation was not reverted.
func noteReverted(nr *coordinatorv1.NodeResult, step string, now int64, st *agentv1.OperationStatus, offset int64) {
	if nr.RevertedUnixNano != 0 {
		return
	}
	if st.GetRevertedBy() != "" && st.GetUpdatedUnixNano() != 0 {
		nr.RevertedUnixNano, nr.RevertedBy = st.GetUpdatedUnixNano()-offset, st.GetRevertedBy()
		return
	}
	if nr.PreparedUnixNano == 0 && nr.AppliedUnixNano == 0 && !PhaseIn(st.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
		return
	}
	nr.RevertedUnixNano, nr.RevertedBy = now, step
}

// NoteReadBack records what the run's end read back from node's agent.
func (op *Op) NoteReadBack(node string, info *agentv1.InfoResponse) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	r := op.results[node]
	if r == nil {
		return
	}
	r.Port = info.GetCurrentPort()
	r.Backend, r.Device = info.GetBackend(), info.GetDevice()
	if o := info.GetOperation(); o != nil && o.GetOperationId() == op.Rec.ID {
		r.AgentPhase = o.GetPhase().String()
		if PhaseIn(o.GetPhase(), agentv1.Phase_PHASE_ABORTED, agentv1.Phase_PHASE_REVERTED) {
			noteReverted(r, "", 0, o, op.Offsets[node].Offset.Nanoseconds())
		}
	}
}

// PairRead is one pair's probe figures as read from its sender's agent:
// the report's row, and the agent's runs of lost sends on the
// coordinator's clock, which place its losses in the phases.
type PairRead struct {
	Pair *coordinatorv1.PairDisruption
	Runs []LossSpan
}

// LossSpan is a run of consecutive lost probes (agent LossRun): the first
// and the last one's send time on the coordinator's clock, and how many.
type LossSpan struct {
	First, Last int64
	Count       uint64
}

// NoteDisruption records the probe mesh's figures as read: the pairs, the
// totals, the longest gap's phase and the phases the losses were sent in,
// and each agent's longest stall.
func (op *Op) NoteDisruption(reads []PairRead, stalls map[string]int64) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	for n, st := range stalls {
		if r := op.results[n]; r != nil {
			r.ProbeStallMicros = st
		}
	}
	r := op.report
	running := string(op.CurStep)
	r.Disruption = make([]*coordinatorv1.PairDisruption, 0, len(reads))
	r.ProbesSent, r.ProbesLost, r.LongestGapMicros = 0, 0, 0
	total := map[string]uint64{}
	for _, rd := range reads {
		p := rd.Pair
		if p.LongestGapMicros > 0 {
			p.LongestGapPhase = phaseAt(r.Phases, p.LongestGapFromUnixNano, running)
		}
		byPhase := map[string]uint64{}
		for _, s := range rd.Runs {
			s.place(func(t int64, n uint64) { byPhase[phaseAt(r.Phases, t, running)] += n })
		}
		p.LostByPhase = phaseLosses(byPhase, r.Phases, running)
		for ph, n := range byPhase {
			total[ph] += n
		}
		r.Disruption = append(r.Disruption, p)
		r.ProbesSent += p.Sent
		r.ProbesLost += p.Lost
		r.LongestGapMicros = max(r.LongestGapMicros, p.LongestGapMicros)
	}
	r.LostByPhase = phaseLosses(total, r.Phases, running)
}

// maxPlacePoints bounds the send times one run is placed at: the count
// comes from an agent, and a run of millions must not cost the coordinator
// millions of lookups.
const maxPlacePoints = 4096

// place calls at(t, n) for n of the run's probes sent at t, the n adding up
// to its count. The run's probes are consecutive sends, one an interval
// apart, so their send times spread evenly between its first and its last;
// past maxPlacePoints, each of that many evenly spread times stands for
// its share. (A run past the agent's cap of runs covers answered probes
// too: there the placement is an estimate.)
func (s LossSpan) place(at func(t int64, n uint64)) {
	points := min(s.Count, maxPlacePoints)
	for i := range points {
		t := s.First
		if points > 1 {
			t += int64(float64(s.Last-s.First) * float64(i) / float64(points-1))
		}
		n := s.Count / points
		if i < s.Count%points {
			n++
		}
		at(t, n)
	}
}

// phaseLosses orders by: before the first phase (""), the phases in the
// report's order, then the one running.
func phaseLosses(by map[string]uint64, phases []*coordinatorv1.PhaseDuration, running string) []*coordinatorv1.PhaseLoss {
	if len(by) == 0 {
		return nil
	}
	order := []string{""}
	for _, p := range phases {
		order = append(order, p.GetPhase())
	}
	order = append(order, running)
	var out []*coordinatorv1.PhaseLoss
	seen := map[string]bool{} // a phase can run twice (a staged batch's verify)
	for _, ph := range order {
		if n, ok := by[ph]; ok && !seen[ph] {
			seen[ph] = true
			out = append(out, &coordinatorv1.PhaseLoss{Phase: ph, Lost: n})
		}
	}
	return out
}

// BatchDone stamps batch b (1-based) of the report: switched (every node
// answered the switch) or verified (the mesh passed after it).
func (op *Op) BatchDone(b int, at time.Time, verified bool) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	b += op.BatchBase // a continued held operation's batches follow the earlier runs'
	if b < 1 || b > len(op.report.Batches) {
		return
	}
	if verified {
		op.report.Batches[b-1].VerifiedUnixNano = at.UnixNano()
	} else {
		op.report.Batches[b-1].SwitchedUnixNano = at.UnixNano()
	}
}

// AddWarning flags the operation's result (Report.warnings), once.
func (op *Op) AddWarning(w string) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	if !slices.Contains(op.report.Warnings, w) {
		op.report.Warnings = append(op.report.Warnings, w)
	}
}

// Reopen marks a finished operation as running again (a rollback).
func (op *Op) Reopen() {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	op.Rec.Outcome = "pending"
	op.report.State = coordinatorv1.OperationState_OPERATION_STATE_RUNNING
	op.report.Error = ""
	op.report.EndedUnixNano = 0
}

// Declaration is the core's Declare, with what the runner adds to it.
type Declaration struct {
	barrier.Declare
	NextSteps    []string      // the hooks' steps for the admin (a success)
	SpreadTarget time.Duration // --commit-spread-target
	Sending      []string      // staged: the nodes that send the new port
	Now          time.Time
}

// Declared records the run's outcome: the phase in flight ends, the
// state, the error (a failed undo's names who was not reached and when
// each undoes the operation by itself; notes follow), the warnings of a
// success that was not clean (late nodes applied, a commit spread above
// target), where each staged node is, and the record's outcome. It
// returns the phase it ended and how long it lasted (ok false: none was
// in flight), for the metrics.
func (op *Op) Declared(d Declaration) (phase barrier.Step, took time.Duration, ok bool) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	r := op.report
	r.NextSteps = d.NextSteps
	if op.CurStep != "" {
		phase, took, ok = op.CurStep, d.Now.Sub(op.StepStart), true
		op.EndPhaseLocked(phase, took, d.Now)
		op.CurStep = ""
	}
	r.State = OutcomeState(d.Outcome)
	r.EndedUnixNano = d.Now.UnixNano()
	r.Error = d.Reason
	op.lateWarningsLocked(d.Outcome)
	op.spreadWarningLocked(d.Outcome, d.SpreadTarget)
	if d.Outcome == barrier.Failed {
		r.Error = FailedErrorLocked(op, d.Declare, d.Now)
	}
	if len(d.Notes) > 0 {
		// Errors that did not change the outcome (hooks after the change
		// was confirmed, a Restore that failed, a journal write).
		if r.Error != "" {
			r.Error += "; "
		}
		r.Error += strings.Join(d.Notes, "\n")
	}
	op.Rec.Step = string(barrier.Done)
	op.Rec.Outcome = d.Outcome.String()
	op.noteStagedLocked(d.Outcome, d.Sending)
	return phase, took, ok
}

// lateWarningsLocked adds the report's warnings for a SUCCEEDED
// operation whose late nodes applied anyway (the wait policy): the
// overlay was split while they were away, so this is not a clean success.
func (op *Op) lateWarningsLocked(out barrier.Outcome) {
	if out != barrier.Succeeded {
		return
	}
	for _, l := range op.report.LateNodes {
		if l.Applied {
			op.report.Warnings = append(op.report.Warnings, fmt.Sprintf("node %s applied the commit %s after the instant (lateness budget %s): the overlay was split meanwhile",
				l.Node, time.Duration(l.LatenessNanos).Round(time.Millisecond), time.Duration(op.report.LateBudgetNanos)))
		}
	}
}

// spreadWarningLocked adds the report's warning for a SUCCEEDED atomic
// operation whose commit spread (the nodes' wake-ups) exceeded target:
// the barrier did not hold, every node flipped but not together, and the
// overlay was split for that long between the first and the last (in
// the lab a 142 ms spread with 340 probes lost once passed as a clean
// success). A warning, not a failure: the change is complete and
// verified; coordctl exits 7.
func (op *Op) spreadWarningLocked(out barrier.Outcome, target time.Duration) {
	r := op.report
	if out != barrier.Succeeded || target <= 0 || r.GetStrategy() == model.StrategyStaged {
		return
	}
	if s := time.Duration(r.GetCommitSpreadNanos()); s > target {
		r.Warnings = append(r.Warnings, fmt.Sprintf("commit spread %s is above the target %s (--commit-spread-target): the nodes did not flip together (effect spread %s), so the overlay was split meanwhile; see the probe disruption and the nodes' load",
			s.Round(100*time.Microsecond), target, time.Duration(r.GetEffectSpreadNanos()).Round(100*time.Microsecond)))
	}
}

// noteStagedLocked records, as a staged run ends, where each node is:
// Switched for a held operation (the journal keeps it for the next run),
// NodeResult.staged for the report.
func (op *Op) noteStagedLocked(out barrier.Outcome, sending []string) {
	if len(op.Rec.Batches) == 0 {
		return
	}
	switch out {
	case barrier.Held:
		op.Rec.Switched = sending
	default:
		op.Rec.Switched = nil
	}
	sends := model.SetOf(sending)
	for _, n := range op.Nodes {
		nr := op.results[n]
		switch {
		case out == barrier.Held && sends[n]:
			nr.Staged = stagedSwitched
		case out == barrier.Held:
			nr.Staged = stagedListening
		case out == barrier.Succeeded:
			nr.Staged = stagedRetired
		default:
			nr.Staged = ""
		}
	}
}

// phaseAt names the phase running at t (the coordinator's clock): the
// recorded phase whose span holds t, the next one when t falls between two,
// and the one still running (running) when t is past them all. "" when t
// is 0 (not measured) or before the first phase.
func phaseAt(phases []*coordinatorv1.PhaseDuration, t int64, running string) string {
	if t == 0 {
		return ""
	}
	seen := false
	for _, p := range phases {
		start := p.GetStartedUnixNano()
		if start == 0 {
			continue // a report written before phases had a start
		}
		if t < start {
			if !seen {
				return ""
			}
			return p.GetPhase()
		}
		seen = true
		if t < start+p.GetNanos() {
			return p.GetPhase()
		}
	}
	if !seen {
		return ""
	}
	return running
}
