// Package coordinator runs Cutover operations: it knows the agents (a
// static inventory), serves the CoordinatorService API to coordctl, and
// drives each operation's plan (prepare → commit at one instant → verify →
// confirm → finalize, or abort/rollback) by feeding the barrier core
// (internal/barrier) with the outcome of parallel gRPC calls to the agents.
// Every transition is journaled (in --state-dir, or in the cluster through
// WithJournal) so that a restarted coordinator, or a new leader, resumes or
// undoes an interrupted operation. Cluster integrations act around an
// operation through Hooks (hooks.go), whose calls are journaled too.
//
// It owns no dataplane: it must never touch OVS, iptables or netlink, only
// ask agents. Decisions (what to send next, when to abort) belong to the
// barrier core; this package does I/O, clocks and bookkeeping.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Option changes how New builds a Coordinator.
type Option func(*options)

type options struct {
	dial     []grpc.DialOption
	verifier Verifier
	log      *slog.Logger
	metrics  *Metrics
	journal  JournalStore
	ctx      context.Context
	hooks    []Hook
}

// JournalStore keeps operation records: the file journal (Journal) or a
// cluster one (coordinator/kube's ConfigMaps). Save replaces the record of
// r.ID whole and must be durable when it returns; Load returns every
// record, oldest first.
type JournalStore interface {
	Save(Record) error
	Load() ([]Record, error)
}

var _ JournalStore = (*Journal)(nil)

// WithJournal keeps the journal in j instead of --state-dir (which is then
// not opened, and not needed).
func WithJournal(j JournalStore) Option { return func(x *options) { x.journal = j } }

// WithContext derives the coordinator's context (under which operations
// call agents and hooks) from ctx: when ctx ends, e.g. the leadership's
// context when the Lease is lost, every call stops at once and operations
// stay where they are, for the journal's next reader to finish or undo.
func WithContext(ctx context.Context) Option { return func(x *options) { x.ctx = ctx } }

// WithHook adds a Hook; several may be given, and are called in the order
// given (Restore in reverse). Names must be unique: they key the journal.
func WithHook(h Hook) Option { return func(x *options) { x.hooks = append(x.hooks, h) } }

// WithDialOptions sets the options used to dial agents (credentials, a
// custom dialer for tests). Without it New dials with mTLS from
// Config.TLS, or plaintext with Config.Insecure.
func WithDialOptions(o ...grpc.DialOption) Option {
	return func(x *options) { x.dial = append(x.dial, o...) }
}

// WithVerifier adds an operation-wide verification after the read-back.
func WithVerifier(v Verifier) Option { return func(x *options) { x.verifier = v } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(x *options) { x.log = l } }

// WithMetrics uses m instead of a fresh set of metrics.
func WithMetrics(m *Metrics) Option { return func(x *options) { x.metrics = m } }

// Coordinator is the coordinator's state: inventory, agent clients,
// journal, operations. It implements coordinatorv1.CoordinatorServiceServer.
type Coordinator struct {
	coordinatorv1.UnimplementedCoordinatorServiceServer

	cfg      Config
	inv      Inventory
	agents   map[string]*agentConn
	journal  JournalStore
	lock     *stateLock // the --state-dir lock (file journal only)
	metrics  *Metrics
	verifier Verifier
	hooks    []Hook
	log      *slog.Logger

	ctx    context.Context // operations run under it, not under an RPC's
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	current *operation // the running operation, at most one
	ops     map[string]*operation
	lastID  string
	seq     int64
}

// New builds a coordinator over inv. It opens the journal (the file one in
// Config.StateDir unless WithJournal is given) but does not resume
// anything: call Resume. The file journal is locked (flock on
// <state-dir>/lock) until Close: a second coordinator on the same state
// dir gets a *StateDirLockedError naming the holder's PID.
func New(cfg Config, inv Inventory, opts ...Option) (*Coordinator, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.metrics == nil {
		o.metrics = NewMetrics()
	}
	if o.dial == nil {
		d, err := agentDialOptions(cfg, o.metrics)
		if err != nil {
			return nil, err
		}
		o.dial = d
	}
	seen := map[string]bool{}
	for i, h := range o.hooks {
		switch {
		case h == nil:
			return nil, fmt.Errorf("hook %d: nil", i)
		case h.Name() == "":
			return nil, fmt.Errorf("hook %d (%T): empty Name: the journal keys hook calls by name", i, h)
		case seen[h.Name()]:
			return nil, fmt.Errorf("hook %d (%T): name %q used by an earlier hook: names key the journal and must be unique", i, h, h.Name())
		}
		seen[h.Name()] = true
	}
	j := o.journal
	var lock *stateLock
	if j == nil {
		// One coordinator per journal: a second one on the same state dir
		// would find the running operation "interrupted" and undo it
		// behind the first one's back. (A cluster journal has the Lease.)
		var err error
		if lock, err = lockStateDir(cfg.StateDir); err != nil {
			return nil, err
		}
		fj, err := OpenJournal(cfg.StateDir)
		if err != nil {
			lock.release()
			return nil, err
		}
		j = fj
	}
	agents, err := dialAgents(inv, o.dial)
	if err != nil {
		lock.release()
		return nil, err
	}
	parent := o.ctx
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	return &Coordinator{cfg: cfg, inv: inv, agents: agents, journal: j, lock: lock, metrics: o.metrics, verifier: o.verifier, hooks: o.hooks,
		log: o.log, ctx: ctx, cancel: cancel, ops: map[string]*operation{}}, nil
}

// Metrics returns the coordinator's metrics.
func (c *Coordinator) Metrics() *Metrics { return c.metrics }

// Close stops running operations where they are (the journal and the
// agents' dead-man timers take over) and closes the agent clients.
func (c *Coordinator) Close() {
	c.cancel()
	c.wg.Wait()
	for _, a := range c.agents {
		_ = a.conn.Close()
	}
	c.lock.release()
}

// Wait blocks until no operation is running.
func (c *Coordinator) Wait() {
	for {
		c.mu.Lock()
		op := c.current
		c.mu.Unlock()
		if op == nil {
			return
		}
		select {
		case <-op.finished():
		case <-time.After(10 * time.Millisecond): // in preflight: not launched yet
		}
	}
}

// operation is one operation's bookkeeping. The barrier core and the
// per-step fields are touched only by the driving goroutine; the rest is
// under mu.
type operation struct {
	core     *barrier.Op
	from, to uint32
	nodes    []string
	step     time.Duration
	deadman  time.Duration
	offsets  map[string]clockSample
	fanout   time.Duration // measured in preflight
	prepDur  time.Duration // how long the prepare round took

	mu        sync.Mutex
	rec       Record
	report    *coordinatorv1.Report
	results   map[string]*coordinatorv1.NodeResult
	events    []*coordinatorv1.OperationEvent
	changed   chan struct{} // closed and replaced at every event
	done      chan struct{} // closed when a run ends
	running   bool
	rollback  chan string
	stepStart time.Time
	curStep   barrier.Step
	applied   map[string]int64 // coordinator clock, by node
	hookErrs  []error          // this run's hook errors that do not change the outcome
	// selfUndo is, by node, the instant (coordinator clock) the agent said
	// it undoes the operation by itself: its prepare deadline while
	// prepared, its dead-man deadline once committed. A Failed report
	// tells the operator when an unreached node will be back in line.
	selfUndo map[string]time.Time
	selfKind map[string]agentv1.Phase // the phase selfUndo was learnt in
	commitAt time.Time                // the last commit instant sent (coordinator clock)

	rollbackAsked bool // the driving goroutine fed RollbackRequested in this run
}

func newOperation(id, kind string, from, to uint32, nodes []string, step, deadman time.Duration, seq int64) *operation {
	op := &operation{from: from, to: to, nodes: nodes, step: step, deadman: deadman, offsets: map[string]clockSample{},
		changed: make(chan struct{}), done: make(chan struct{}), rollback: make(chan string, 1),
		results: map[string]*coordinatorv1.NodeResult{}, applied: map[string]int64{}, selfUndo: map[string]time.Time{}, selfKind: map[string]agentv1.Phase{}}
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
	op.mu.Lock()
	defer op.mu.Unlock()
	op.events = append(op.events, &coordinatorv1.OperationEvent{OperationId: op.rec.ID, Phase: phase, Node: node,
		Message: msg, Failed: failed, UnixNano: time.Now().UnixNano(), Report: report})
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

// save journals the operation; failures are logged and reported as events
// (the operation itself goes on: stopping half way would be worse).
func (c *Coordinator) save(op *operation) error {
	op.mu.Lock()
	rep := op.snapshotLocked()
	b, err := protojson.Marshal(rep)
	if err == nil {
		op.rec.Report = b
	}
	rec := op.rec
	op.mu.Unlock()
	if err == nil {
		err = c.journal.Save(rec)
	}
	if err != nil {
		c.log.Error("journal", "operation", rec.ID, "err", err)
		op.emit("journal", "", "journal write failed: "+err.Error(), true, nil)
	}
	return err
}

// reserve claims the single operation slot for op.
func (c *Coordinator) reserve(op *operation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current != nil {
		return status.Errorf(codes.FailedPrecondition, "operation %s is running (%s): wait for it or roll it back; only one operation runs at a time",
			c.current.rec.ID, c.current.curPhase())
	}
	if _, dup := c.ops[op.rec.ID]; dup {
		return status.Errorf(codes.AlreadyExists, "operation_id %q: already used: pick another id or leave it empty", op.rec.ID)
	}
	c.current = op
	return nil
}

func (op *operation) curPhase() string {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.curStep == "" {
		return "preflight"
	}
	return string(op.curStep)
}

// release frees the slot without recording op (preflight refused it).
func (c *Coordinator) release(op *operation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == op {
		c.current = nil
	}
}

// launch records op and runs first (the core's first actions) in the
// background. The caller holds the slot (c.current == op).
func (c *Coordinator) launch(op *operation, first []barrier.Action) {
	done := make(chan struct{})
	c.mu.Lock()
	c.ops[op.rec.ID] = op
	c.lastID = op.rec.ID
	c.current = op
	op.mu.Lock()
	op.running = true
	op.done = done
	op.mu.Unlock()
	c.mu.Unlock()
	c.wg.Go(func() { c.drive(op, first, done) })
}

// drive runs the event loop of one operation run: actions from the core
// become parallel calls; their results become events for the core. Only
// drive touches op.core while op.running.
func (c *Coordinator) drive(op *operation, acts []barrier.Action, done chan struct{}) {
	defer close(done)
	evCh := make(chan barrier.Event, 64)
	stop := make(chan struct{})
	defer close(stop)
	post := func(ev barrier.Event) {
		select {
		case evCh <- ev:
		case <-stop:
		}
	}
	for {
		for _, a := range acts {
			switch a := a.(type) {
			case barrier.Send:
				if a.Step == barrier.Finalize && a.Attempt == 1 {
					// Every agent confirmed: the change is verified good.
					c.afterSuccess(op, HookAfterConfirm)
				}
				c.enterStep(op, a)
				go func() {
					if a.After > 0 {
						// A retry's back-off, asked by the core (it has no
						// clock). Nothing else is in flight meanwhile: the
						// core waits for this attempt's answers.
						t := time.NewTimer(a.After)
						defer t.Stop()
						select {
						case <-t.C:
						case <-c.ctx.Done():
							return // drive stops the run
						}
					}
					c.dispatch(op, a, post)
				}()
			case barrier.Declare:
				switch a.Outcome {
				case barrier.Succeeded:
					c.afterSuccess(op, HookFinalize)
				case barrier.Aborted, barrier.RolledBack:
					c.restore(op)
				}
				if op.core.CommitSent() {
					// Nodes may have flipped: the report shows the
					// disruption whatever the outcome, read once the
					// operation is over (its settle wait delays nothing).
					c.probeStats(op, false)
				}
				c.declare(op, a)
			}
		}
		if op.core.Outcome() != barrier.Pending {
			var more bool
			if acts, more = c.endRun(op); !more {
				return
			}
			continue
		}
		select {
		case ev := <-evCh:
			if len(c.hooks) > 0 && op.completesPrepare(ev) {
				// Every agent is prepared and the core would send Commit
				// now: BeforeCommit runs first, and its failure turns the
				// barrier into an abort (nothing has flipped).
				if err := c.beforeCommit(op); err != nil {
					op.core.Step(barrier.StepFailed{Step: barrier.Prepare, Reason: err.Error()})
				}
				if c.ctx.Err() != nil {
					// Stopping (the Lease lost?) while BeforeCommit ran:
					// never commit now. The journal says prepared with
					// BeforeCommit made, so the next run aborts and
					// calls Restore.
					c.stopRun(op)
					return
				}
			}
			acts = op.core.Step(ev)
		case reason := <-op.rollback:
			op.emit("rollback", "", "rollback requested: "+reason, false, nil)
			op.rollbackAsked = true
			acts = op.core.Step(barrier.RollbackRequested{Reason: reason})
		case <-c.ctx.Done():
			c.stopRun(op)
			return
		}
	}
}

// stopRun ends a run at shutdown (or when the Lease is lost): the
// operation stays where it is. The journal says where; the next start (or
// leader) resumes or undoes it, and the agents' dead-man timers cover a
// commit in between.
func (c *Coordinator) stopRun(op *operation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	op.emit(string(op.core.Phase()), "", "coordinator stopping: the operation resumes at the next start", true, op.snapshot())
	op.mu.Lock()
	op.running = false
	op.mu.Unlock()
	if c.current == op {
		c.current = nil
	}
}

// enterStep closes the previous step's duration, journals and announces
// the new step.
func (c *Coordinator) enterStep(op *operation, s barrier.Send) {
	now := time.Now()
	op.mu.Lock()
	prev, started := op.curStep, op.stepStart
	if prev != "" && prev != s.Step {
		d := now.Sub(started)
		if prev == barrier.Prepare {
			op.prepDur = d
		}
		c.phaseDoneLocked(op, prev, d)
	}
	if prev != s.Step {
		op.stepStart = now
	}
	op.curStep = s.Step
	op.rec.Step = string(s.Step)
	op.rec.CommitSent = op.core.CommitSent()
	op.mu.Unlock()
	c.metrics.setPhase(string(s.Step))
	msg := fmt.Sprintf("%s: sending to %d agent(s)", s.Step, len(s.Nodes))
	switch {
	case s.Attempt > 1 && s.After > 0:
		msg = fmt.Sprintf("%s: retrying %s in %s (attempt %d)", s.Step, strings.Join(s.Nodes, ","), s.After, s.Attempt)
	case s.Attempt > 1:
		msg += fmt.Sprintf(" (attempt %d)", s.Attempt)
	}

	// Journal before the first call goes out: after a crash the record must
	// never claim less than what the agents may have seen (commit_sent in
	// particular).
	_ = c.save(op)
	op.emit(string(s.Step), "", msg, false, nil)
}

// phaseDoneLocked records that step lasted d: in the report and the
// phase duration histogram. op.mu is held.
func (c *Coordinator) phaseDoneLocked(op *operation, step barrier.Step, d time.Duration) {
	op.report.Phases = append(op.report.Phases, &coordinatorv1.PhaseDuration{Phase: string(step), Nanos: d.Nanoseconds()})
	c.metrics.phaseDuration.WithLabelValues(string(step)).Observe(d.Seconds())
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
	}
	return coordinatorv1.OperationState_OPERATION_STATE_RUNNING
}

// declare records the outcome; endRun finishes the run.
func (c *Coordinator) declare(op *operation, d barrier.Declare) {
	now := time.Now()
	op.mu.Lock()
	if op.curStep != "" {
		c.phaseDoneLocked(op, op.curStep, now.Sub(op.stepStart))
		op.curStep = ""
	}
	op.report.State = outcomeState(d.Outcome)
	op.report.EndedUnixNano = now.UnixNano()
	op.report.Error = d.Reason
	if d.Outcome == barrier.Failed {
		undo := "rollback"
		if !op.core.CommitSent() {
			undo = "abort"
		}
		took := now.Sub(op.stepStart).Round(100 * time.Millisecond)
		op.report.Error = fmt.Sprintf("%s; %s could not reach %s (%d attempts over %s): an operator must check %s",
			d.Reason, undo, strings.Join(d.Unreached, ","), op.core.Tries(), took, map[bool]string{true: "it", false: "them"}[len(d.Unreached) == 1])
		for _, n := range d.Unreached {
			op.report.Error += "; " + n + ": " + op.selfUndoLocked(n, now)
		}
	}
	op.mu.Unlock()
	if he := op.takeHookErrors(); he != "" {
		op.mu.Lock()
		if op.report.Error != "" {
			op.report.Error += "; "
		}
		op.report.Error += he
		op.mu.Unlock()
	}
	op.mu.Lock()
	op.rec.Step = string(barrier.Done)
	op.rec.Outcome = d.Outcome.String()
	op.mu.Unlock()
	c.metrics.operations.WithLabelValues(d.Outcome.String()).Inc()
	c.metrics.setPhase("idle")
}

// endRun reads every node's final state into the report, journals it,
// sends the last event and frees the slot. A rollback requested while the
// run was ending is taken instead (more is true and acts are its actions).
func (c *Coordinator) endRun(op *operation) (acts []barrier.Action, more bool) {
	out := op.core.Outcome()
	ctx, cancel := context.WithTimeout(c.ctx, op.step)
	fanOut(op.nodes, func(n string) {
		info, err := c.agents[n].client.Info(ctx, &agentv1.InfoRequest{})
		if err != nil {
			return
		}
		op.setResult(n, func(r *coordinatorv1.NodeResult) {
			r.Port = info.CurrentPort
			if o := info.Operation; o != nil && o.OperationId == op.rec.ID {
				r.AgentPhase = o.Phase.String()
			}
		})
	})
	cancel()
	_ = c.save(op)
	rep := op.snapshot()
	c.mu.Lock()
	select {
	case reason := <-op.rollback:
		if acts := op.core.Step(barrier.RollbackRequested{Reason: reason}); len(acts) > 0 {
			c.mu.Unlock()
			op.reopen()
			op.emit("rollback", "", "rollback requested: "+reason, false, nil)
			return acts, true
		}
	default:
	}
	msg := "operation " + out.String()
	if rep.Error != "" {
		msg += ": " + rep.Error
	}
	// The last event goes out before running turns false, so that a
	// Rollback stream started after this never sees it as its own end.
	op.emit("done", "", msg, out != barrier.Succeeded, rep)
	op.mu.Lock()
	op.running = false
	op.mu.Unlock()
	if c.current == op {
		c.current = nil
	}
	c.mu.Unlock()
	c.log.Info("operation ended", "operation", op.rec.ID, "outcome", out.String(), "error", rep.Error)
	return nil, false
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

// coreConfig is the barrier core's configuration of an operation over
// nodes. An abort or rollback retries an unreached agent with back-off for
// the dead-man duration and a second: an agent that is restarting is
// reached when it is back, and one that stays unreachable has by then
// reverted a commit by itself (I4); a prepare it aborts at its own
// (longer) prepare deadline, which the Failed report names.
func (c *Coordinator) coreConfig(nodes []string, step, deadman time.Duration) barrier.Config {
	return barrier.Config{Nodes: nodes, StepTimeout: step, RollbackAttempts: c.cfg.RollbackAttempts,
		RetryBackoff: c.cfg.RollbackBackoff, RetryBackoffMax: 8 * c.cfg.RollbackBackoff, RetryFor: deadman + time.Second}
}

// deadmanFor is the dead-man duration sent with the commit of an operation
// whose steps last step: never shorter than three steps, so that verify
// and confirm fit before the agents revert by themselves.
func (c *Coordinator) deadmanFor(step time.Duration) time.Duration {
	return max(c.cfg.Deadman, 3*step)
}

// commitLead is how far ahead the commit instant is set: enough for every
// Commit call to arrive before it. The worst single round trip is not
// enough with many agents: sending N calls costs time of its own (CPU,
// connection writes), so the lead also covers twice the measured duration
// of preflight's first parallel round (Info to every target), plus a
// configurable per-agent allowance. The prepare round is the best proxy
// of all (same agents, same kind of durable write just before answering):
// the lead covers it too.
func (c *Coordinator) commitLead(op *operation) time.Duration {
	var maxRTT time.Duration
	for _, s := range op.offsets {
		maxRTT = max(maxRTT, s.rtt)
	}
	op.mu.Lock()
	prep := op.prepDur
	op.mu.Unlock()
	return c.cfg.CommitLeadMin + max(time.Duration(c.cfg.CommitLeadRTTx)*maxRTT, 2*op.fanout, prep) + time.Duration(len(op.nodes))*c.cfg.CommitLeadPerAgt
}

// callResult classifies an agent call: ok, failed with a message, or
// timed out.
func callResult(node string, s barrier.Send, err error, ok bool, why string) barrier.Event {
	if err != nil {
		st := status.Convert(err)
		if st.Code() == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
			return barrier.Timeout{Node: node, Step: s.Step, Attempt: s.Attempt}
		}
		return barrier.Reply{Node: node, Step: s.Step, Attempt: s.Attempt, Err: fmt.Sprintf("%s: %s", st.Code(), st.Message())}
	}
	return barrier.Reply{Node: node, Step: s.Step, Attempt: s.Attempt, OK: ok, Err: why}
}

func phaseIn(p agentv1.Phase, ps ...agentv1.Phase) bool { return slices.Contains(ps, p) }

// dispatch sends one step to its agents in parallel and posts one event
// per agent (plus a Deadline backstop).
func (c *Coordinator) dispatch(op *operation, s barrier.Send, post func(barrier.Event)) {
	id := op.rec.ID
	timeout := s.Timeout
	var commitAt time.Time
	switch s.Step {
	case barrier.Commit:
		lead := c.commitLead(op)
		commitAt = time.Now().Add(lead)
		timeout += lead
		op.mu.Lock()
		op.commitAt = commitAt
		op.mu.Unlock()
	case barrier.Prepare:
		// Zero the probe counters alongside Prepare, not before it: a
		// frozen agent must not hold up everyone's Prepare. The answers
		// are held until the reset ended (within its short bound), so
		// that Commit, which they release, never overtakes a reset.
		resetDone := make(chan struct{})
		go func() { defer close(resetDone); c.probeStats(op, true) }()
		fed := post
		post = func(ev barrier.Event) { <-resetDone; fed(ev) }
	}
	backstop := time.AfterFunc(timeout+time.Second, func() { post(barrier.Deadline{Step: s.Step, Attempt: s.Attempt}) })
	defer backstop.Stop()
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	var verifyEvents []barrier.Event
	var mu sync.Mutex
	fanOut(s.Nodes, func(n string) {
		cl := c.agents[n].client
		var ev barrier.Event
		switch s.Step {
		case barrier.Prepare:
			r, err := cl.Prepare(ctx, &agentv1.PrepareRequest{OperationId: id, FromPort: op.from, ToPort: op.to})
			ph := r.GetStatus().GetPhase()
			op.noteSelfUndo(n, r.GetStatus())
			ev = callResult(n, s, err, ph == agentv1.Phase_PHASE_PREPARED, fmt.Sprintf("agent answered %s: %s", ph, r.GetStatus().GetError()))
		case barrier.Commit:
			at := commitAt.Add(op.offsets[n].offset)
			r, err := cl.Commit(ctx, &agentv1.CommitRequest{OperationId: id, AtUnixNano: at.UnixNano(), DeadmanMillis: op.deadman.Milliseconds()})
			ph := r.GetStatus().GetPhase()
			op.noteSelfUndo(n, r.GetStatus())
			ok := err == nil && phaseIn(ph, agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED) && r.ReadbackPort == op.to
			if err == nil {
				applied := r.AppliedUnixNano - op.offsets[n].offset.Nanoseconds()
				op.setResult(n, func(nr *coordinatorv1.NodeResult) {
					nr.AppliedUnixNano, nr.ApplyNanos = applied, r.ApplyNanos
				})
				op.mu.Lock()
				op.applied[n] = applied
				op.mu.Unlock()
			}
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s, read back port %d (want %d): %s", ph, r.GetReadbackPort(), op.to, r.GetStatus().GetError()))
		case barrier.Verify:
			info, err := cl.Info(ctx, &agentv1.InfoRequest{})
			o := info.GetOperation()
			ok := info.GetCurrentPort() == op.to && o.GetOperationId() == id &&
				phaseIn(o.GetPhase(), agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED)
			ev = callResult(n, s, err, ok, fmt.Sprintf("read back port %d (want %d), operation %q %s", info.GetCurrentPort(), op.to, o.GetOperationId(), o.GetPhase()))
			mu.Lock()
			verifyEvents = append(verifyEvents, ev)
			mu.Unlock()
			return
		case barrier.Confirm:
			r, err := cl.Confirm(ctx, &agentv1.ConfirmRequest{OperationId: id})
			ok := phaseIn(r.GetPhase(), agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED)
			ev = callResult(n, s, err, ok, fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
		case barrier.Finalize:
			r, err := cl.Finalize(ctx, &agentv1.FinalizeRequest{OperationId: id})
			ev = callResult(n, s, err, r.GetPhase() == agentv1.Phase_PHASE_FINALIZED, fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
		case barrier.Abort, barrier.Rollback:
			r, err := cl.Rollback(ctx, &agentv1.RollbackRequest{OperationId: id, Reason: op.core.Reason()})
			if err != nil && status.Code(err) != codes.NotFound && ctx.Err() == nil {
				// Before counting the node as not reached, ask where it
				// is: an agent that undid the operation by itself (its
				// dead-man, its prepare timeout) or never saw it is done,
				// whatever made the Rollback call fail.
				if st, serr := cl.Status(ctx, &agentv1.StatusRequest{OperationId: id}); serr == nil && undone(st) {
					r, err = st, nil
				} else if status.Code(serr) == codes.NotFound {
					err = serr
				}
			}
			if status.Code(err) == codes.NotFound {
				err = nil // the agent never saw the operation: nothing to undo
				r = &agentv1.OperationStatus{Phase: agentv1.Phase_PHASE_IDLE}
			}
			ev = callResult(n, s, err, undone(r), fmt.Sprintf("agent answered %s: %s", r.GetPhase(), r.GetError()))
		}
		c.noteNode(op, n, ev)
		post(ev)
	})
	if s.Step == barrier.Verify {
		// The operation-wide verifier runs after the read-back and is fed
		// before the per-node answers, so a failure lands inside the step.
		allOK := true
		for _, ev := range verifyEvents {
			if r, ok := ev.(barrier.Reply); !ok || !r.OK {
				allOK = false
			}
		}
		if allOK && c.verifier != nil {
			if err := c.verifier.Verify(ctx, VerifyInput{OperationID: id, FromPort: op.from, ToPort: op.to, Nodes: s.Nodes}); err != nil {
				op.emit("verify", "", "verification failed: "+err.Error(), true, nil)
				post(barrier.StepFailed{Step: barrier.Verify, Reason: err.Error()})
			}
		}
		for _, ev := range verifyEvents {
			c.noteNode(op, nodeOf(ev), ev)
			post(ev)
		}
	}
	if s.Step == barrier.Commit {
		c.commitSpread(op)
	}
}

func nodeOf(ev barrier.Event) string {
	switch e := ev.(type) {
	case barrier.Reply:
		return e.Node
	case barrier.Timeout:
		return e.Node
	}
	return ""
}

// noteNode records a failed agent answer in the node result and as an event.
func (c *Coordinator) noteNode(op *operation, node string, ev barrier.Event) {
	var msg string
	switch e := ev.(type) {
	case barrier.Reply:
		if e.OK {
			if (e.Step == barrier.Abort || e.Step == barrier.Rollback) && e.Attempt > 1 {
				// Reached by a retry: say so next to the failed attempts.
				msg = fmt.Sprintf("%s: reached at attempt %d", e.Step, e.Attempt)
				op.setResult(node, func(r *coordinatorv1.NodeResult) {
					if r.Error != "" {
						r.Error += "; " + msg
					}
				})
				op.emit(op.curPhase(), node, msg, false, nil)
			}
			return
		}
		msg = fmt.Sprintf("%s failed: %s", e.Step, e.Err)
	case barrier.Timeout:
		msg = fmt.Sprintf("%s: no answer within the step deadline", e.Step)
	default:
		return
	}
	op.setResult(node, func(r *coordinatorv1.NodeResult) {
		switch {
		case r.Error == "":
			r.Error = msg
		case strings.HasSuffix(r.Error, msg) || strings.HasSuffix(r.Error, msg+" (again)"):
			// A retry failing the same way: the report says it once.
			r.Error = strings.TrimSuffix(r.Error, " (again)") + " (again)"
		default:
			r.Error += "; " + msg
		}
	})
	op.emit(op.curPhase(), node, msg, true, nil)
}

func (c *Coordinator) commitSpread(op *operation) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if len(op.applied) == 0 {
		return
	}
	lo, hi := int64(1<<63-1), int64(-1<<63)
	for _, t := range op.applied {
		lo, hi = min(lo, t), max(hi, t)
	}
	op.report.CommitSpreadNanos = hi - lo
	c.metrics.commitSpread.Set(time.Duration(hi - lo).Seconds())
}

// probeStatsBound bounds the probe counters' reset and read: they are
// figures for the report, never worth holding an operation up for.
const probeStatsBound = time.Second

// probeStats resets (alongside prepare) or reads (when an operation that
// reached commit ends, whatever its outcome) the agents' probe mesh
// counters, each call within min(1 s, step). Agents without peers report
// nothing: harmless. A node that does not answer is reported in an event,
// never fatal: its figures are missing, or for a failed reset include
// traffic from before the operation.
//
// Probes still in flight when the counters are read are not counted yet
// (an agent settles a probe when it is answered or timed out), so a read
// that finds probing on waits --probe-settle and reads again: the figures
// then cover the operation to its end. Without probing nothing waits.
func (c *Coordinator) probeStats(op *operation, reset bool) {
	c.probeStatsOnce(op, reset, !reset && c.cfg.ProbeSettle > 0)
}

func (c *Coordinator) probeStatsOnce(op *operation, reset, settleThenAgain bool) {
	ctx, cancel := context.WithTimeout(c.ctx, min(probeStatsBound, op.step))
	defer cancel()
	var mu sync.Mutex
	var pairs []*coordinatorv1.PairDisruption
	var missed []string
	fanOut(op.nodes, func(n string) {
		r, err := c.agents[n].client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{Reset_: reset})
		if err != nil {
			mu.Lock()
			missed = append(missed, n+" ("+status.Convert(err).Message()+")")
			mu.Unlock()
			return
		}
		if reset {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range r.Peers {
			pairs = append(pairs, &coordinatorv1.PairDisruption{From: n, To: p.Peer, Sent: p.Sent, Lost: p.Lost, LongestGapMicros: p.LongestGapMicros})
		}
	})
	if len(missed) > 0 && c.ctx.Err() == nil {
		slices.Sort(missed)
		what := "read"
		if reset {
			what = "reset: their disruption figures include traffic from before the operation"
		}
		c.log.Warn("probe counters", "reset", reset, "missed", missed)
		op.emit(op.curPhase(), "", fmt.Sprintf("probe counters of %s could not be %s", strings.Join(missed, ", "), what), false, nil)
	}
	if reset {
		return
	}
	if settleThenAgain && len(pairs) > 0 {
		select {
		case <-time.After(c.cfg.ProbeSettle):
			c.probeStatsOnce(op, false, false)
			return
		case <-c.ctx.Done():
		}
	}
	slices.SortFunc(pairs, func(a, b *coordinatorv1.PairDisruption) int {
		if a.From != b.From {
			return strings.Compare(a.From, b.From)
		}
		return strings.Compare(a.To, b.To)
	})
	op.mu.Lock()
	defer op.mu.Unlock()
	op.report.Disruption = pairs
	op.report.ProbesSent, op.report.ProbesLost, op.report.LongestGapMicros = 0, 0, 0
	for _, p := range pairs {
		op.report.ProbesSent += p.Sent
		op.report.ProbesLost += p.Lost
		op.report.LongestGapMicros = max(op.report.LongestGapMicros, p.LongestGapMicros)
	}
}

// undone reports whether an agent's status means the operation is undone
// on it, or was never done: nothing prepared, committed or stuck there.
func undone(st *agentv1.OperationStatus) bool {
	return !phaseIn(st.GetPhase(), agentv1.Phase_PHASE_PREPARED, agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED,
		agentv1.Phase_PHASE_FINALIZED, agentv1.Phase_PHASE_FAILED)
}

// noteSelfUndo keeps the instant node said it undoes the operation by
// itself (agent clock → coordinator clock).
func (op *operation) noteSelfUndo(node string, st *agentv1.OperationStatus) {
	if st.GetDeadlineUnixNano() == 0 || st.GetOperationId() != op.rec.ID {
		return
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	op.selfUndo[node] = time.Unix(0, st.GetDeadlineUnixNano()).Add(-op.offsets[node].offset)
	op.selfKind[node] = st.GetPhase()
}

// selfUndoLocked says when an unreached node undoes the operation by
// itself, as far as the coordinator knows: the deadline it reported (its
// prepare deadline while prepared, its dead-man once committed), or what
// follows from the commit instant and the dead-man sent with it. The
// timers run in the agent: a stopped agent acts on a passed deadline as
// soon as it starts again, and not before.
func (op *operation) selfUndoLocked(node string, now time.Time) string {
	when := func(t time.Time) string {
		at := t.UTC().Format("15:04:05.000Z")
		if d := t.Sub(now).Round(100 * time.Millisecond); d > 0 {
			return fmt.Sprintf("%s (in %s)", at, d)
		}
		return fmt.Sprintf("%s (passed %s ago)", at, now.Sub(t).Round(100*time.Millisecond))
	}
	const passed = "a running agent has undone the operation by itself, a stopped one does as soon as it starts again; check it"
	dl, known := op.selfUndo[node]
	kind := op.selfKind[node]
	commitSent := op.core.CommitSent() && !op.commitAt.IsZero()
	deadman := op.commitAt.Add(op.deadman)
	const prepTimeout = "the agent's --prepare-timeout after its Prepare, 5m by default"
	switch {
	case known && kind == agentv1.Phase_PHASE_COMMITTED:
		if dl.Before(now) {
			return "committed; its dead-man deadline passed at " + when(dl) + ": " + passed
		}
		return "committed; its dead-man reverts it by itself at " + when(dl)
	case known && commitSent:
		if dl.Before(now) && deadman.Before(now) {
			return "prepared, and its prepare deadline (" + when(dl) + ") and the dead-man of the commit sent to it (" + when(deadman) + ") both passed: " + passed
		}
		return "prepared, and the commit may or may not have reached it: if it did, its dead-man reverts it at " + when(deadman) + "; if not, it aborts at its prepare deadline " + when(dl)
	case known:
		if dl.Before(now) {
			return "prepared at most (nothing flipped); its prepare deadline passed at " + when(dl) + ": " + passed
		}
		return "prepared at most (nothing flipped); it aborts by itself at its prepare deadline " + when(dl)
	case commitSent:
		return "state unknown: if it committed, its dead-man reverts it at " + when(deadman) + "; if it only prepared, it aborts at its prepare deadline (" + prepTimeout + ")"
	}
	return "state unknown, prepared at most (nothing flipped): if it prepared, it aborts by itself at its prepare deadline (" + prepTimeout + ")"
}
