package opstate

import (
	"slices"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/probemesh"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Op is one operation's bookkeeping. The barrier core and the
// per-step fields are touched only by the driving goroutine; the rest is
// under Mu.
type Op struct {
	Core     *barrier.Op
	From, To tunnelport.Port
	Nodes    []string
	Step     time.Duration
	Deadman  time.Duration
	Offsets  map[string]fleet.ClockSample
	PrepDur  time.Duration // how long the prepare round took
	// PrepAnswers is when each answer of the last Prepare round came,
	// from the round's start (commitLead).
	PrepAnswers []time.Duration
	// BatchBase (staged) is how many report batches earlier runs of a
	// held operation ran: the core numbers this run's from 1.
	BatchBase int

	// The journal writer (the coordinator's save): WriteMu orders record writes, EncodeMu
	// the report's encodings, SaveMu guards EncodeQueued (an encoding is
	// asked for and has not started); Encoders are the background ones.
	WriteMu, EncodeMu, SaveMu sync.Mutex
	EncodeQueued              bool
	Encoders                  sync.WaitGroup

	Mu      sync.Mutex
	Rec     model.Record
	report  *coordinatorv1.Report                // report.go is its one writer
	results map[string]*coordinatorv1.NodeResult // and of these
	Events  []*coordinatorv1.OperationEvent
	// PriorEvents are the events journaled by runs before a coordinator
	// restart: the report's log keeps them; followers are not replayed them.
	PriorEvents []*coordinatorv1.OperationEvent
	Changed     chan struct{} // closed and replaced at every event
	Done        chan struct{} // closed when a run ends
	Running     bool
	Rollback    chan string
	StepStart   time.Time
	CurStep     barrier.Step
	Applied     map[string]int64 // coordinator clock, by node: the agents' wake-ups
	Written     map[string]int64 // the same: the writes leaving for the dataplane
	LastArrival int64            // the latest Commit arrival at an agent (coordinator clock; atomic only)
	Effective   map[string]int64 // the same: the dataplanes' confirmations
	// selfUndo is, by node, the instant (coordinator clock) the agent said
	// it undoes the operation by itself: its prepare deadline while
	// prepared, its dead-man deadline once committed. A Failed report
	// tells the operator when an unreached node will be back in line.
	selfUndo map[string]time.Time
	selfKind map[string]agentv1.Phase // the phase selfUndo was learnt in
	CommitAt time.Time                // the last commit instant sent (coordinator clock)
	// The probe mesh chosen in preflight (preflight.PlanProbes): peers sent with
	// Prepare, pairs verify checks. ProbePlanned is false for a resumed
	// run: verify then checks the peers the agents report.
	ProbePeers   map[string][]*agentv1.ProbePeer
	ProbePairs   []probemesh.Pair
	ProbePlanned bool
	// VerifyStats are the probe figures the Verify step's read-back
	// brought (Info with probe_stats), by node: the mesh verifier's first
	// round, which takes them, reads only the senders not in it.
	VerifyStats map[string]*agentv1.ProbeStatsResponse
}

func New(id, kind string, from, to tunnelport.Port, nodes []string, step, deadman time.Duration, seq int64) *Op {
	op := &Op{From: from, To: to, Nodes: nodes, Step: step, Deadman: deadman, Offsets: map[string]fleet.ClockSample{},
		Changed: make(chan struct{}), Done: make(chan struct{}), Rollback: make(chan string, 1),
		Applied: map[string]int64{}, Written: map[string]int64{}, Effective: map[string]int64{}, selfUndo: map[string]time.Time{}, selfKind: map[string]agentv1.Phase{}}
	op.Rec = model.Record{ID: id, Kind: kind, FromPort: from, ToPort: to, Nodes: nodes, StepMillis: step.Milliseconds(), Outcome: "pending", Seq: seq}
	op.startReport(id, from, to, nodes)
	return op
}

func (op *Op) Finished() <-chan struct{} {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	return op.Done
}

// Emit appends a progress event. A non-nil report marks the last event of
// a run.
func (op *Op) Emit(phase, node, msg string, failed bool, report *coordinatorv1.Report) {
	op.EmitEvent(&coordinatorv1.OperationEvent{Phase: phase, Node: node, Message: msg, Failed: failed, Report: report})
}

// EmitEvent appends ev, stamped with the operation and the time.
func (op *Op) EmitEvent(ev *coordinatorv1.OperationEvent) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	ev.OperationId, ev.UnixNano = op.Rec.ID, time.Now().UnixNano()
	op.Events = append(op.Events, ev)
	close(op.Changed)
	op.Changed = make(chan struct{})
}

func (op *Op) CurPhase() string {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	if op.CurStep == "" {
		return "preflight"
	}
	return string(op.CurStep)
}

// NoteSelfUndo keeps the instant node said it undoes the operation by
// itself (agent clock → coordinator clock).
func (op *Op) NoteSelfUndo(node string, st *agentv1.OperationStatus) {
	if st.GetDeadlineUnixNano() == 0 || st.GetOperationId() != op.Rec.ID {
		return
	}
	op.Mu.Lock()
	defer op.Mu.Unlock()
	op.selfUndo[node] = time.Unix(0, st.GetDeadlineUnixNano()).Add(-op.Offsets[node].Offset)
	op.selfKind[node] = st.GetPhase()
}

func OutcomeState(o barrier.Outcome) coordinatorv1.OperationState {
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

// JournaledReport is rep as journaled. The binary size is a lower bound
// of the JSON's (names, quotes, decimal numbers): a report whose binary
// form is already past the bound is slimmed without marshalling it whole
// first. At 1,000 nodes every save
// marshalled the report twice, 25–50 ms of each step.
func JournaledReport(rep *coordinatorv1.Report) ([]byte, error) {
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

func (op *Op) SetHookMark(m model.HookMark) {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	for i := range op.Rec.Hooks {
		if op.Rec.Hooks[i].Hook == m.Hook && op.Rec.Hooks[i].Point == m.Point {
			op.Rec.Hooks[i] = m
			return
		}
	}
	op.Rec.Hooks = append(op.Rec.Hooks, m)
}

func (op *Op) Info() model.OpInfo {
	op.Mu.Lock()
	defer op.Mu.Unlock()
	return model.OpInfo{ID: op.Rec.ID, Kind: op.Rec.Kind, FromPort: op.From, ToPort: op.To, Nodes: slices.Clone(op.Nodes)}
}

// Follow streams op's events from index from until the run's last event.
// A client that goes away stops only its stream, never the operation.
func (op *Op) Follow(stream grpc.ServerStreamingServer[coordinatorv1.OperationEvent], from int) error {
	for {
		op.Mu.Lock()
		evs := op.Events[from:]
		ch := op.Changed
		op.Mu.Unlock()
		for _, ev := range evs {
			if err := stream.Send(ev); err != nil {
				return err
			}
			from++
			if ev.Report != nil {
				return nil
			}
		}
		select {
		case <-ch:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}
