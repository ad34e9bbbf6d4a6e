package coordinator

import (
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"

	"slices"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/probemesh"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// operation is one operation's bookkeeping. The barrier core and the
// per-step fields are touched only by the driving goroutine; the rest is
// under mu.
type operation struct {
	core     *barrier.Op
	from, to uint32
	nodes    []string
	step     time.Duration
	deadman  time.Duration
	offsets  map[string]fleet.ClockSample
	prepDur  time.Duration // how long the prepare round took
	// prepAnswers is when each answer of the last Prepare round came,
	// from the round's start (commitLead).
	prepAnswers []time.Duration
	// batchBase (staged) is how many report batches earlier runs of a
	// held operation ran: the core numbers this run's from 1.
	batchBase int

	// The journal writer (save): writeMu orders record writes, encodeMu
	// the report's encodings, saveMu guards encodeQueued (an encoding is
	// asked for and has not started); encoders are the background ones.
	writeMu, encodeMu, saveMu sync.Mutex
	encodeQueued              bool
	encoders                  sync.WaitGroup

	mu      sync.Mutex
	rec     Record
	report  *coordinatorv1.Report
	results map[string]*coordinatorv1.NodeResult
	events  []*coordinatorv1.OperationEvent
	// priorEvents are the events journaled by runs before a coordinator
	// restart: the report's log keeps them; followers are not replayed them.
	priorEvents []*coordinatorv1.OperationEvent
	changed     chan struct{} // closed and replaced at every event
	done        chan struct{} // closed when a run ends
	running     bool
	rollback    chan string
	stepStart   time.Time
	curStep     barrier.Step
	applied     map[string]int64 // coordinator clock, by node: the agents' wake-ups
	written     map[string]int64 // the same: the writes leaving for the dataplane
	lastArrival int64            // the latest Commit arrival at an agent (coordinator clock; atomic only)
	effective   map[string]int64 // the same: the dataplanes' confirmations
	// selfUndo is, by node, the instant (coordinator clock) the agent said
	// it undoes the operation by itself: its prepare deadline while
	// prepared, its dead-man deadline once committed. A Failed report
	// tells the operator when an unreached node will be back in line.
	selfUndo map[string]time.Time
	selfKind map[string]agentv1.Phase // the phase selfUndo was learnt in
	commitAt time.Time                // the last commit instant sent (coordinator clock)
	// The probe mesh chosen in preflight (preflight.PlanProbes): peers sent with
	// Prepare, pairs verify checks. probePlanned is false for a resumed
	// run: verify then checks the peers the agents report.
	probePeers   map[string][]*agentv1.ProbePeer
	probePairs   []probemesh.Pair
	probePlanned bool
	// verifyStats are the probe figures the Verify step's read-back
	// brought (Info with probe_stats), by node: the mesh verifier's first
	// round, which takes them, reads only the senders not in it.
	verifyStats map[string]*agentv1.ProbeStatsResponse
}

func newOperation(id, kind string, from, to uint32, nodes []string, step, deadman time.Duration, seq int64) *operation {
	op := &operation{from: from, to: to, nodes: nodes, step: step, deadman: deadman, offsets: map[string]fleet.ClockSample{},
		changed: make(chan struct{}), done: make(chan struct{}), rollback: make(chan string, 1),
		results: map[string]*coordinatorv1.NodeResult{}, applied: map[string]int64{}, written: map[string]int64{}, effective: map[string]int64{}, selfUndo: map[string]time.Time{}, selfKind: map[string]agentv1.Phase{}}
	op.rec = Record{ID: id, Kind: kind, FromPort: from, ToPort: to, Nodes: nodes, StepMillis: step.Milliseconds(), Outcome: "pending", Seq: seq}
	op.report = &coordinatorv1.Report{OperationId: id, State: coordinatorv1.OperationState_OPERATION_STATE_RUNNING,
		FromPort: from, ToPort: to, StartedUnixNano: time.Now().UnixNano()}
	for _, n := range nodes {
		op.results[n] = &coordinatorv1.NodeResult{Node: n}
	}
	return op
}

func (op *operation) finished() <-chan struct{} {
	op.mu.Lock()
	defer op.mu.Unlock()
	return op.done
}

// emit appends a progress event. A non-nil report marks the last event of
// a run.
func (op *operation) emit(phase, node, msg string, failed bool, report *coordinatorv1.Report) {
	op.emitEvent(&coordinatorv1.OperationEvent{Phase: phase, Node: node, Message: msg, Failed: failed, Report: report})
}

// emitEvent appends ev, stamped with the operation and the time.
func (op *operation) emitEvent(ev *coordinatorv1.OperationEvent) {
	op.mu.Lock()
	defer op.mu.Unlock()
	ev.OperationId, ev.UnixNano = op.rec.ID, time.Now().UnixNano()
	op.events = append(op.events, ev)
	close(op.changed)
	op.changed = make(chan struct{})
}

// snapshot returns a copy of the report with the node results, in node order.
func (op *operation) snapshot() *coordinatorv1.Report {
	op.mu.Lock()
	defer op.mu.Unlock()
	return op.snapshotLocked()
}

func (op *operation) snapshotLocked() *coordinatorv1.Report {
	r := proto.Clone(op.report).(*coordinatorv1.Report)
	r.Events = op.eventsLocked()
	if !op.commitAt.IsZero() {
		r.CommitUnixNano = op.commitAt.UnixNano()
	}
	r.Nodes = nil
	for _, n := range op.nodes {
		r.Nodes = append(r.Nodes, proto.Clone(op.results[n]).(*coordinatorv1.NodeResult))
	}
	return r
}

func (op *operation) setResult(node string, f func(*coordinatorv1.NodeResult)) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if r, ok := op.results[node]; ok {
		f(r)
	}
}

// save journals the operation's control fields now (step, commit_sent,
// hooks: what a restarted coordinator decides from) and its report soon:
// the record is written at once with the report last encoded, and the
// report is encoded again in the background, the newest state taken when
// the encoder is free (requests while it is busy coalesce). The report is
// the change record, not the protocol's state; encoding it took 35-75 ms
// at 1,000 nodes and 0.3-0.7 s at 10,000 per save, with op.mu held, at
// every step boundary. After a crash the journaled report is
// at most one background encoding old. Failures are logged and reported
// as events (the operation itself goes on: stopping half way would be
// worse); the error returned is the synchronous write's.
func (c *Coordinator) save(op *operation) error {
	err := c.writeRecord(op)
	op.saveMu.Lock()
	if !op.encodeQueued {
		op.encodeQueued = true
		op.encoders.Add(1)
		c.wg.Add(1) // Close waits for it: the state dir's lock outlives no write
		go func() {
			defer c.wg.Done()
			defer op.encoders.Done()
			_ = c.encodeAndWrite(op)
		}()
	}
	op.saveMu.Unlock()
	return err
}

// saveFinal journals the record and its report together, synchronously,
// after any background encoding: the record an ended run leaves.
func (c *Coordinator) saveFinal(op *operation) error {
	op.encoders.Wait()
	return c.encodeAndWrite(op)
}

// encodeAndWrite encodes the report as it is now, outside op.mu, then
// writes the record. Encodings are serialised (encodeMu), so the report
// bytes a record carries only ever get newer.
func (c *Coordinator) encodeAndWrite(op *operation) error {
	op.encodeMu.Lock()
	defer op.encodeMu.Unlock()
	op.saveMu.Lock()
	op.encodeQueued = false // a save from here on needs an encoding after this one
	op.saveMu.Unlock()
	op.mu.Lock()
	rep := op.snapshotLocked()
	op.mu.Unlock()
	b, err := journaledReport(rep)
	if err != nil {
		c.journalFailed(op, err)
		return err
	}
	op.mu.Lock()
	op.rec.Report = b
	op.mu.Unlock()
	return c.writeRecord(op)
}

// writeRecord writes op's record as it is at the write (the freshest
// control fields and report bytes: writes are serialised, so a later
// write never carries older state).
func (c *Coordinator) writeRecord(op *operation) error {
	op.writeMu.Lock()
	defer op.writeMu.Unlock()
	op.mu.Lock()
	rec := op.rec
	rec.Hooks = slices.Clone(rec.Hooks) // setHookMark changes marks in place
	op.mu.Unlock()
	err := c.journal.Save(rec)
	if err != nil {
		c.journalFailed(op, err)
	}
	if rec.Terminal() {
		c.pruneOps()
	}
	return err
}

func (c *Coordinator) journalFailed(op *operation, err error) {
	c.log.Error("journal", "operation", op.rec.ID, "err", err)
	op.emit("journal", "", "journal write failed: "+err.Error(), true, nil)
}

// maxPrunedIDs bounds the memory of pruned ids (for Status's message).
const maxPrunedIDs = 10000

// pruneOps drops from memory the finished operations the journal drops
// (Prunable with the same keep), so that memory is bounded like the
// journal. The operation running, if any, is never dropped.
func (c *Coordinator) pruneOps() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var recs []Record
	for id, op := range c.ops {
		op.mu.Lock()
		rec, running := op.rec, op.running
		op.mu.Unlock()
		if running || op == c.current || id == c.lastID {
			continue
		}
		recs = append(recs, rec)
	}
	// lastID is not a candidate but counts as kept.
	keep := c.cfg.KeptOperations()
	if last, ok := c.ops[c.lastID]; ok && last.rec.Terminal() {
		keep--
	}
	if c.pruned == nil || len(c.pruned) > maxPrunedIDs {
		c.pruned = map[string]bool{}
	}
	for _, r := range Prunable(recs, keep) {
		delete(c.ops, r.ID)
		c.pruned[r.ID] = true
	}
}

func (op *operation) curPhase() string {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.curStep == "" {
		return "preflight"
	}
	return string(op.curStep)
}

// reopen marks a finished operation as running again (a rollback).
func (op *operation) reopen() {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.rec.Outcome = "pending"
	op.report.State = coordinatorv1.OperationState_OPERATION_STATE_RUNNING
	op.report.Error = ""
	op.report.EndedUnixNano = 0
}

// noteSelfUndo keeps the instant node said it undoes the operation by
// itself (agent clock → coordinator clock).
func (op *operation) noteSelfUndo(node string, st *agentv1.OperationStatus) {
	if st.GetDeadlineUnixNano() == 0 || st.GetOperationId() != op.rec.ID {
		return
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	op.selfUndo[node] = time.Unix(0, st.GetDeadlineUnixNano()).Add(-op.offsets[node].Offset)
	op.selfKind[node] = st.GetPhase()
}

func outcomeState(o barrier.Outcome) coordinatorv1.OperationState {
	switch o {
	case barrier.Succeeded:
		return coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED
	case barrier.Aborted:
		return coordinatorv1.OperationState_OPERATION_STATE_ABORTED
	case barrier.RolledBack:
		return coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK
	case barrier.Failed:
		return coordinatorv1.OperationState_OPERATION_STATE_FAILED
	case barrier.Held:
		return coordinatorv1.OperationState_OPERATION_STATE_HELD
	}
	return coordinatorv1.OperationState_OPERATION_STATE_RUNNING
}

// maxJournaledRecord bounds the change record's share of a journaled
// report: past it, the events and the plan's per-node actions (they grow
// with the cluster, and a Kubernetes journal drops a report whole above
// its object limit) stay in memory only; the rest, what a restarted
// coordinator reports, is kept.
const maxJournaledRecord = 384 << 10

// journaledReport is rep as journaled. The binary size is a lower bound
// of the JSON's (names, quotes, decimal numbers): a report whose binary
// form is already past the bound is slimmed without marshalling it whole
// first. At 1,000 nodes every save
// marshalled the report twice, 25–50 ms of each step.
func journaledReport(rep *coordinatorv1.Report) ([]byte, error) {
	if proto.Size(rep) <= maxJournaledRecord {
		b, err := protojson.Marshal(rep)
		if err != nil || len(b) <= maxJournaledRecord {
			return b, err
		}
	}
	slim := proto.Clone(rep).(*coordinatorv1.Report)
	slim.Events = nil
	for _, n := range slim.GetPlan().GetNodes() {
		n.Actions = nil
	}
	return protojson.Marshal(slim)
}

// addWarning flags the operation's result (Report.warnings), once.
func (op *operation) addWarning(w string) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if !slices.Contains(op.report.Warnings, w) {
		op.report.Warnings = append(op.report.Warnings, w)
	}
}
