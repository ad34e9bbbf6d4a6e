// Package operation owns the agent's one-at-a-time port-change operation:
// the phases Prepared → Committed (dead-man armed) → Confirmed → Finalized,
// or Aborted, Reverted, Failed; the durable record that lets a restarted
// agent resume exactly (and revert by itself at a dead-man deadline that
// survives restarts); and the precise sleep that applies a commit at an
// instant of the node's clock.
//
// It drives a dataplane.Backend and a Store and takes its time from a Clock,
// so it is tested without sockets, kernels or real sleeps. It must not know
// about gRPC, flags or metrics libraries: the service maps its Codes to
// status codes and an Observer feeds the metrics.
//
// Files: machine.go, the phases the coordinator drives (Prepare, Commit,
// Confirm, Rollback, Finalize); staged.go, the staged strategy's phases;
// selfundo.go, what the machine undoes by itself (dead-man, prepare
// timeout); record.go and store.go, the durable record; bookkeeping.go,
// the record's small helpers; clock.go, the clock and the precise sleep.
package operation

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Options configures a Machine.
type Options struct {
	Backend dataplane.Backend // required
	Store   Store             // required
	Clock   Clock             // default RealClock
	// PrepareTimeout bounds how long a prepared operation waits for Commit
	// or Rollback before the agent aborts it by itself, so a vanished
	// coordinator cannot leave a firewall opening forever. Default 5m.
	PrepareTimeout time.Duration
	// CallTimeout bounds each backend call the machine makes on its own
	// (apply, revert, abort): those are not cut short by a caller going
	// away, since a half-done change is worse than a late answer.
	// Default 30s.
	CallTimeout time.Duration
	Observer    Observer     // default: none
	Logger      *slog.Logger // default: slog.Default()
	// FlipDelay, when set, is how long an atomic commit waits after its
	// instant before it applies. Only the test-only fault injection build
	// sets it (agent/faultinject.go): a barrier that does not hold, which
	// the lab's spread bounds must catch. nil in the shipped agent.
	FlipDelay func() time.Duration
	// AfterCommitHold caps how long an answered commit's after-work
	// (afterCommit: the record, the backend's cleanup, the log) waits
	// after the commit instant so that it does not run while other nodes
	// are still in their windows: until the instant plus the commit's
	// lateness budget, or plus this cap when the budget is larger or
	// zero. The next command for the machine cuts the wait short. Zero:
	// no wait (the unit tests' default; the agent sets it).
	AfterCommitHold time.Duration
}

// Machine is the operation state machine of one agent. Its methods are safe
// for concurrent use: mutations (RPCs and timers) are serialised, so a
// dead-man firing concurrently with Confirm has exactly one winner; Status
// never waits for a backend call.
type Machine struct {
	be dataplane.Backend
	// afterWG counts the afterCommit calls in flight (Settle).
	afterWG sync.WaitGroup
	store   Store
	clock   Clock
	obs     Observer
	log     *slog.Logger

	prepareTimeout time.Duration
	callTimeout    time.Duration
	flipDelay      func() time.Duration // Options.FlipDelay
	holdCap        time.Duration        // Options.AfterCommitHold

	opMu sync.Mutex // serialises mutations, held across backend calls; taken by lockOp
	// hold, while an answered commit's after-work waits (afterCommit), is
	// closed by the next command to end that wait; nil otherwise.
	holdMu sync.Mutex
	hold   chan struct{}
	timer  Timer  // the armed prepare-timeout or dead-man timer
	gen    uint64 // bumped on every transition: stale timers do nothing
	closed bool

	mu  sync.Mutex // guards rec and relistenErr, held briefly
	rec *Record
	// relistenErr is why a staged node could not listen on both ports
	// again after a restart (staged.go, relistenLocked); "" once it does.
	relistenErr string
}

// New loads the record from the store and resumes it: a PREPARING record
// (crash during Prepare) is aborted; a PREPARED one keeps its prepare
// timeout; a COMMITTED one is reverted now if its dead-man deadline has
// passed, else its timer is re-armed. A record that cannot be read is an
// error: it may describe a change still applied.
func New(ctx context.Context, o Options) (*Machine, error) {
	if o.Backend == nil || o.Store == nil {
		return nil, fmt.Errorf("operation.New: Backend and Store are required")
	}
	m := &Machine{
		be:             o.Backend,
		store:          o.Store,
		clock:          o.Clock,
		obs:            o.Observer,
		log:            o.Logger,
		prepareTimeout: o.PrepareTimeout,
		callTimeout:    o.CallTimeout,
		flipDelay:      o.FlipDelay,
		holdCap:        o.AfterCommitHold,
	}
	if m.clock == nil {
		m.clock = RealClock{}
	}
	if m.obs == nil {
		m.obs = nopObserver{}
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.prepareTimeout <= 0 {
		m.prepareTimeout = 5 * time.Minute
	}
	if m.callTimeout <= 0 {
		m.callTimeout = 30 * time.Second
	}
	rec, err := m.store.Load()
	if err != nil {
		return nil, err
	}
	m.lockOp()
	defer m.opMu.Unlock()
	if rec == nil {
		m.obs.PhaseChanged(PhaseIdle)
		return m, nil
	}
	m.setLocked(*rec)
	m.log.Info("operation record loaded", "operation", rec.ID, "phase", rec.Phase, "path", m.store.Path())
	now := m.clock.Now()
	switch rec.Phase {
	case PhasePreparing:
		m.abortLocked(ctx, *rec, ByRestart, "agent restarted during prepare")
	case PhasePrepared:
		if rec.Staged() {
			m.relistenAfterRestartLocked(ctx, *rec)
			break // a listening node never stops listening by itself
		}
		if rec.PrepareDeadline.IsZero() {
			rec.PrepareDeadline = now.Add(m.prepareTimeout)
		}
		m.armLocked(rec.PrepareDeadline.Sub(now), m.prepareTimedOut)
	case PhaseCommitted:
		if rec.Staged() {
			m.relistenAfterRestartLocked(ctx, *rec)
		}
		if !now.Before(rec.Deadline) {
			m.log.Warn("dead-man deadline passed while the agent was down: reverting now",
				"operation", rec.ID, "deadline", rec.Deadline)
			m.deadmanLocked(*rec)
		} else {
			m.armLocked(rec.Deadline.Sub(now), m.deadmanFired)
		}
	case PhaseConfirmed:
		if rec.Staged() {
			m.relistenAfterRestartLocked(ctx, *rec)
		}
	}
	return m, nil
}

// Close disarms the timers (the record on disk keeps the deadlines: a
// restarted agent re-arms them). It does not touch the dataplane.
func (m *Machine) Close() {
	m.lockOp()
	defer m.opMu.Unlock()
	m.closed = true
	m.disarmLocked()
}

// Status returns the record of operation id, or the current or last one
// when id is empty (a record in PhaseIdle when there was none).
func (m *Machine) Status(id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec == nil {
		if id == "" {
			return Record{Phase: PhaseIdle}, nil
		}
		return Record{}, errf(CodeNotFound, nil, "operation %s unknown: this agent has run no operation", id)
	}
	if id != "" && id != m.rec.ID {
		return Record{}, errf(CodeNotFound, nil, "operation %s unknown: the last operation on this agent is %s (%s)", id, m.rec.ID, m.rec.Phase)
	}
	return *m.rec, nil
}

// NotReady names what keeps the machine from working: an unwritable state
// store, or an operation FAILED that needs an operator.
func (m *Machine) NotReady() []string {
	var out []string
	if err := m.store.Check(); err != nil {
		out = append(out, "state dir: "+err.Error())
	}
	if r, _ := m.Status(""); r.Phase == PhaseFailed {
		out = append(out, fmt.Sprintf("operation %s FAILED: %s", r.ID, r.Error))
	}
	m.mu.Lock()
	if m.relistenErr != "" {
		out = append(out, m.relistenErr)
	}
	m.mu.Unlock()
	return out
}

// Prepare snapshots the prior state, persists it, then has the backend
// open the target port and pre-build the change. A replay with the same id
// and ports returns the record without acting again.
func (m *Machine) Prepare(ctx context.Context, id string, from, to tunnelport.Port) (Record, error) {
	return m.PrepareStrategy(ctx, id, from, to, "")
}

// PrepareStrategy is Prepare for a strategy: StrategyStaged has the
// backend listen on both ports (dataplane.Stager) instead of pre-building
// a flip, and arms no prepare timeout. Empty or StrategyAtomic: Prepare.
func (m *Machine) PrepareStrategy(ctx context.Context, id string, from, to tunnelport.Port, strategy string) (Record, error) {
	if strategy == StrategyAtomic {
		strategy = ""
	}
	if strategy != "" && strategy != StrategyStaged {
		return Record{}, errf(CodeInvalidArgument, nil, "strategy %q: must be %q or %q", strategy, StrategyAtomic, StrategyStaged)
	}
	m.lockOp()
	defer m.opMu.Unlock()
	if cur := m.current(); cur != nil && cur.ID == id && cur.Snapshot != nil && cur.Strategy != strategy {
		return *cur, errf(CodeInvalidArgument, nil,
			"operation %s was prepared with strategy %s; this request says %s: use a new operation id for a different change",
			id, strategyName(cur.Strategy), strategyName(strategy))
	}
	if cur := m.current(); cur != nil && cur.ID == id {
		// A rollback that came first leaves a record without ports.
		if cur.Snapshot != nil && (cur.FromPort != from || cur.ToPort != to) {
			return *cur, errf(CodeInvalidArgument, nil,
				"operation %s was prepared for port %d -> %d; this request says %d -> %d: use a new operation id for a different change",
				id, cur.FromPort, cur.ToPort, from, to)
		}
		switch cur.Phase {
		case PhaseAborted:
			if cur.RevertedBy == "" { // the original prepare failed: same outcome
				return *cur, errf(CodeAborted, nil, "operation %s: %s", id, cur.Error)
			}
			return *cur, errf(CodeFailedPrecondition, nil, "operation %s was aborted by %s at %s: use a new operation id",
				id, cur.RevertedBy, stamp(cur.Ended))
		case PhaseFailed:
			return *cur, errf(CodeInternal, nil, "operation %s failed: %s", id, cur.Error)
		}
		return *cur, nil
	}
	if err := m.refuseIfBusyLocked(id); err != nil {
		return Record{}, err
	}
	if err := m.store.Check(); err != nil {
		return Record{}, errf(CodeUnavailable, err, "prepare %s refused before any change", id)
	}
	if strategy == StrategyStaged {
		if _, ok := m.be.(dataplane.Stager); !ok {
			return Record{}, errf(CodeFailedPrecondition, nil, "prepare %s: backend %s does not support the staged strategy (nothing changed)", id, m.be.Name())
		}
	}
	snap, err := m.be.Snapshot(ctx, from, to)
	if err != nil {
		return Record{}, errf(CodeFailedPrecondition, err, "prepare %s: snapshot of %s %s (nothing changed)", id, m.be.Name(), m.be.Device())
	}
	now := m.clock.Now()
	rec := Record{ID: id, Phase: PhasePreparing, FromPort: from, ToPort: to, Snapshot: &snap, Strategy: strategy, CurrentPort: from, Updated: now}
	if err := m.store.Save(rec); err != nil {
		return Record{}, errf(CodeUnavailable, err, "prepare %s refused before any change", id)
	}
	m.setLocked(rec)
	if err := m.prepareBackend(ctx, rec); err != nil {
		m.log.Warn("prepare failed: aborting", "operation", id, "err", err)
		out := m.abortLocked(ctx, rec, "", "prepare: "+err.Error())
		if out.Phase == PhaseFailed {
			return out, errf(CodeInternal, nil, "operation %s: %s", id, out.Error)
		}
		return out, errf(CodeAborted, nil, "operation %s: %s (aborted: nothing left changed)", id, out.Error)
	}
	rec.Phase = PhasePrepared
	rec.Updated = m.clock.Now()
	if !rec.Staged() {
		rec.PrepareDeadline = rec.Updated.Add(m.prepareTimeout)
	}
	if err := m.store.Save(rec); err != nil {
		// The disk said PREPARING: a restart would abort. Undo now rather
		// than run an operation this agent cannot record.
		out := m.abortLocked(ctx, rec, "", "persist prepared: "+err.Error())
		return out, errf(CodeUnavailable, err, "prepare %s: could not record it, so it was aborted", id)
	}
	m.setLocked(rec)
	if !rec.Staged() {
		m.armLocked(m.prepareTimeout, m.prepareTimedOut)
	}
	return rec, nil
}

// Commit applies the prepared change at instant at of the agent's clock
// (zero or past: now) and arms the dead-man timer: unless Confirm comes
// within deadman after the apply, the agent reverts by itself. The
// COMMITTED record and its deadline are persisted before the apply, so a
// crash during it still reverts at the deadline after a restart. Once
// accepted, the commit runs to the end even if the caller goes away: every
// node must flip at the same instant.
func (m *Machine) Commit(ctx context.Context, id string, at time.Time, deadman time.Duration) (Record, error) {
	return m.CommitWithin(ctx, id, at, deadman, 0, time.Time{})
}

// CommitWithin is Commit with a lateness budget: an agent that reaches the
// instant more than budget after it (it was frozen, starved, or the
// request came late) applies nothing, aborts the prepared change and
// answers CodeAborted. The coordinator has rolled the others back by then
// (docs/faults.md, "Late commits"): applying now would split the overlay
// again. Zero budget: apply however late, as long as the caller still
// waits for the answer: a call reached after abandon (the caller's own
// deadline, in this agent's clock; zero: none) or whose ctx is already
// done is refused the same way.
func (m *Machine) CommitWithin(ctx context.Context, id string, at time.Time, deadman, budget time.Duration, abandon time.Time) (Record, error) {
	if deadman <= 0 {
		return Record{}, errf(CodeInvalidArgument, nil, "deadman %s: must be positive", deadman)
	}
	m.lockOp()
	unlock := true // false: afterCommit holds the lock on and releases it
	defer func() {
		if unlock {
			m.opMu.Unlock()
		}
	}()
	cur, err := m.sameOpLocked(id)
	if err != nil {
		return Record{}, err
	}
	switch cur.Phase {
	case PhasePrepared:
	case PhaseCommitted, PhaseConfirmed, PhaseFinalized:
		return cur, nil // replay: the stored result
	default:
		return cur, m.endedErr(cur, "commit")
	}
	if gone := m.abandoned(ctx, cur, abandon); gone != nil {
		// The caller gave up before the agent took the call (it was
		// frozen, or the call waited behind another): the coordinator
		// counts this node unreachable and may have moved every other
		// node back already. Whatever the lateness budget, applying now
		// would flip this node alone, and nobody would confirm it. The
		// call's context alone cannot tell: a call read late gets a
		// deadline counted from its reading.
		m.log.Warn("commit call already abandoned by its caller: aborting, nothing applied", "operation", id)
		return m.refuseLocked(ctx, cur, fmt.Sprintf("commit reached the agent after its caller gave up (%v): not applied", gone), 0)
	}
	now := m.clock.Now()
	start := now
	if at.After(now) {
		start = at
	}
	rec := cur
	rec.Phase = PhaseCommitted
	rec.CommitAt = at
	rec.Deadman = deadman
	rec.Deadline = start.Add(deadman)
	rec.Updated = now
	if err := m.store.Save(rec); err != nil {
		return cur, errf(CodeUnavailable, err, "commit %s refused before any change", id)
	}
	m.disarmLocked() // the prepare timeout
	m.setLocked(rec)

	var late time.Duration
	if at.After(now) {
		m.armCommit(ctx, rec, at)
		late = m.clock.SleepUntil(at)
	} else if !at.IsZero() {
		late = now.Sub(at)
	}
	if gone := m.abandoned(ctx, rec, abandon); gone != nil {
		// Stopped while it waited for the instant (frozen past the
		// caller's deadline): the same refusal, before anything is applied.
		m.log.Warn("commit call abandoned while waiting for its instant: aborting, nothing applied", "operation", id, "late", late)
		return m.refuseLocked(ctx, rec, fmt.Sprintf("commit reached its instant after its caller gave up (%v): not applied", gone), 0)
	}
	if budget > 0 && late > budget {
		m.log.Warn("late for the commit instant: aborting, nothing applied", "operation", id, "late", late, "budget", budget)
		return m.refuseLocked(ctx, rec, fmt.Sprintf("commit late by %s (lateness budget %s): not applied", late.Round(time.Millisecond), budget), late)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.callTimeout)
	defer cancel()
	if m.flipDelay != nil && !rec.Staged() {
		m.clock.SleepUntil(m.clock.Now().Add(m.flipDelay()))
	}
	t0 := m.clock.Now()
	st, err := m.commitBackend(actx, rec)
	dur := m.clock.Now().Sub(t0)
	rec.Applied, rec.ApplyDuration, rec.Lateness = t0, dur, late
	if err == nil && st.Port != rec.ToPort {
		err = fmt.Errorf("read back port %d after commit, want %d", st.Port, rec.ToPort)
	}
	if err != nil {
		m.log.Error("commit failed: reverting now", "operation", id, "err", err)
		rec.Error = "commit: " + err.Error()
		if rec.Staged() {
			// Only this node's sending is undone: peers may already send
			// the new port, so it keeps listening on both.
			out := m.unswitchLocked(rec, ByApplyFailure)
			if out.Phase == PhaseFailed {
				return out, errf(CodeInternal, nil, "operation %s: %s", id, out.Error)
			}
			return out, errf(CodeAborted, nil, "operation %s: %s (sending back on port %d, still listening on both)", id, rec.Error, rec.FromPort)
		}
		out := m.revertLocked(rec, ByApplyFailure)
		if out.Phase == PhaseFailed {
			return out, errf(CodeInternal, nil, "operation %s: %s", id, out.Error)
		}
		return out, errf(CodeAborted, nil, "operation %s: %s (reverted to port %d)", id, rec.Error, rec.FromPort)
	}
	rec.ReadbackPort, rec.CurrentPort = st.Port, st.Port
	rec.Written, rec.Effective = st.Written, st.Effective
	rec.Deadline = t0.Add(deadman)
	rec.Updated = m.clock.Now()
	m.setLocked(rec)
	m.obs.Applied(dur, late)
	m.obs.PortObserved(st.Port)
	m.armLocked(rec.Deadline.Sub(m.clock.Now()), m.deadmanFired)
	// The answer leaves now; what it need not wait for runs after it,
	// still under opMu, so the next command for the operation (a replayed
	// Commit, Confirm, Rollback) is served only once it is done.
	unlock = false
	m.afterWG.Add(1)
	until, cut := m.holdAfter(rec, start, budget)
	go m.afterCommit(rec, st, late, dur, until, cut)
	return rec, nil
}

// holdAfter is when an answered commit's after-work may start, and what
// the next command closes to start it at once (nil: it need not wait).
// On one node nothing else waits for that work; where nodes share a
// kernel (the lab, the many-core machine's) an early node's work (an
// fsync, six netlink dumps, a dump of the whole conntrack table) ran
// while later nodes were inside their windows and stretched them: the
// windows' median 7 ms against 3 ms for the same recreate with nothing
// beside it, the effect spread 12-39 ms at N = 8 (make bench-lab-n8).
// By the instant plus the lateness budget every node that applies has
// begun to; the work then runs. A staged switch has no common instant.
func (m *Machine) holdAfter(rec Record, start time.Time, budget time.Duration) (time.Time, chan struct{}) {
	if m.holdCap <= 0 || rec.Staged() {
		return time.Time{}, nil
	}
	d := m.holdCap
	if budget > 0 {
		d = min(budget, d)
	}
	until := start.Add(d)
	if !until.After(m.clock.Now()) {
		return time.Time{}, nil
	}
	cut := make(chan struct{})
	m.holdMu.Lock()
	m.hold = cut
	m.holdMu.Unlock()
	return until, cut
}

// lockOp takes opMu for a command, first ending the hold of an answered
// commit's after-work (holdAfter), which holds opMu: the command would
// otherwise wait for it.
func (m *Machine) lockOp() {
	m.endHold(nil)
	m.opMu.Lock()
}

// endHold ends the hold cut (any: nil), if it is still the current one.
func (m *Machine) endHold(cut chan struct{}) {
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	if m.hold != nil && (cut == nil || m.hold == cut) {
		close(m.hold)
		m.hold = nil
	}
}

// armCommit lets the backend do the reading its Commit needs now, while
// the agent waits for the instant, instead of between the instant and
// the flip (dataplane.CommitArmer). It may use half the time left to the
// instant, and is skipped when that is too little to be worth it.
func (m *Machine) armCommit(ctx context.Context, rec Record, at time.Time) {
	ca, ok := m.be.(dataplane.CommitArmer)
	if !ok || rec.Staged() {
		return
	}
	budget := at.Sub(m.clock.Now()) / 2
	if budget < minArmBudget {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	if err := ca.ArmCommit(actx, *rec.Snapshot); err != nil {
		m.log.Warn("could not read ahead of the commit instant: the commit reads at the instant", "operation", rec.ID, "err", err)
	}
}

// minArmBudget is the least time armCommit may take: an early read takes
// milliseconds (up to tens on a loaded node), and one that could not
// finish well before the instant would delay the flip it is meant to
// speed up.
const minArmBudget = 20 * time.Millisecond

// refuseLocked aborts the prepared (or just recorded) change of a commit
// that must not apply, nothing applied, and answers ABORTED with why; late,
// when the refusal is for lateness, travels in the error (LateOf). The
// abort runs even if the caller's context already ended: what Prepare
// opened must be closed either way.
func (m *Machine) refuseLocked(ctx context.Context, rec Record, why string, late time.Duration) (Record, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.callTimeout)
	defer cancel()
	out := m.abortLocked(actx, rec, ByLate, why)
	if out.Phase == PhaseFailed {
		return out, errf(CodeInternal, nil, "operation %s: %s", rec.ID, out.Error)
	}
	return out, &Error{Code: CodeAborted, Msg: fmt.Sprintf("operation %s: %s (still on port %d)", rec.ID, why, rec.FromPort), Late: late}
}

// abandoned says why the caller of a commit no longer waits for it (nil:
// it does): its context ended, or abandon (the caller's deadline, this
// agent's clock; zero: none) has passed. Never for a staged switch: peers
// may already send the new port, and refusing would abort this node's
// listening on it.
func (m *Machine) abandoned(ctx context.Context, rec Record, abandon time.Time) error {
	if rec.Staged() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if now := m.clock.Now(); !abandon.IsZero() && now.After(abandon) {
		return fmt.Errorf("its deadline passed %s ago", now.Sub(abandon).Round(time.Millisecond))
	}
	return nil
}

// afterCommit is what an applied commit needs that its answer need not
// wait for; it holds opMu, taken by CommitWithin, and releases it. It
// starts once the hold holdAfter set ends (until, or cut closed by the
// next command): the other nodes' windows come first.
// Recording the applied result (an fsync: 11-50 ms per node in an 8-node
// lab) can wait: the record saved before the flip is already COMMITTED
// with an earlier deadline, so a restart in between reverts no later
// than this one would, and the in-memory record answers replays. The
// backend's AfterCommit (the kernel's conntrack cleanup: 90-220 ms) and
// the log line can wait too. Together they held each answer back by
// 150-250 ms at N = 8 and ~600 ms at N = 32 in the lab, and the
// coordinator judged the node late by it.
func (m *Machine) afterCommit(rec Record, st dataplane.State, late, dur time.Duration, until time.Time, cut chan struct{}) {
	defer m.afterWG.Done()
	defer m.opMu.Unlock()
	held := time.Duration(0)
	if cut != nil {
		th := m.clock.Now()
		t := m.clock.AfterFunc(until.Sub(th), func() { m.endHold(cut) })
		<-cut
		t.Stop()
		held = m.clock.Now().Sub(th)
	}
	t0 := m.clock.Now()
	if err := m.store.Save(rec); err != nil {
		// The persisted record already holds an earlier deadline: a
		// restart reverts no later than this one would.
		m.log.Error("could not record the applied commit; the persisted deadline stands", "operation", rec.ID, "err", err)
	}
	saved := m.clock.Now().Sub(t0)
	var after map[string]string
	if ac, ok := m.be.(dataplane.AfterCommitter); ok && !rec.Staged() {
		ctx, cancel := context.WithTimeout(context.Background(), m.callTimeout)
		var err error
		after, err = ac.AfterCommit(ctx, *rec.Snapshot)
		cancel()
		if err != nil {
			m.log.Warn("after the commit: cleanup failed (the change stands)", "operation", rec.ID, "err", err)
		}
	}
	// What the backend measured (the kernel's window, say) goes to the
	// log: an operator comparing nodes after a change reads it there.
	attrs := []any{"operation", rec.ID, "port", st.Port, "late", late, "apply", dur, "held", held, "record", saved}
	for _, d := range []map[string]string{st.Detail, after} {
		for _, k := range slices.Sorted(maps.Keys(d)) {
			attrs = append(attrs, k, d[k])
		}
	}
	m.log.Info("committed", attrs...)
}

// Settle waits until the work of every answered commit (afterCommit) is
// done: the applied result recorded, the backend's cleanup run. It ends
// the work's hold first.
func (m *Machine) Settle() {
	m.endHold(nil)
	m.afterWG.Wait()
}

// Confirm disarms the dead-man timer: the change stays. CONFIRMED is
// persisted before the timer is disarmed, so a confirm that cannot be
// recorded is refused and the dead-man still reverts.
func (m *Machine) Confirm(_ context.Context, id string) (Record, error) {
	m.lockOp()
	defer m.opMu.Unlock()
	cur, err := m.sameOpLocked(id)
	if err != nil {
		return Record{}, err
	}
	switch cur.Phase {
	case PhaseCommitted:
	case PhaseConfirmed, PhaseFinalized:
		return cur, nil
	case PhasePrepared:
		return cur, errf(CodeFailedPrecondition, nil, "operation %s is PREPARED, not committed: commit it before confirming", id)
	default:
		return cur, m.endedErr(cur, "confirm")
	}
	rec := cur
	rec.Phase = PhaseConfirmed
	rec.Updated = m.clock.Now()
	if err := m.store.Save(rec); err != nil {
		return cur, errf(CodeUnavailable, err, "confirm %s could not be recorded; the dead-man timer stays armed (deadline %s)", id, stamp(cur.Deadline))
	}
	m.disarmLocked()
	m.setLocked(rec)
	return rec, nil
}

// Rollback undoes whatever operation id did here: a prepared operation is
// aborted, a committed or confirmed one reverted, a failed one reverted
// again. Ended operations are returned as they are. A rollback for an
// operation this agent never saw records it as aborted, so that a Prepare
// arriving late for it is refused. Rollback only puts the node back, so it
// goes ahead even when the state store is failing (the error is reported in
// the record).
func (m *Machine) Rollback(ctx context.Context, id, reason string) (Record, error) {
	return m.RollbackScope(ctx, id, reason, false)
}

// RollbackScope is Rollback; with sendOnly, a staged operation that
// switched this node's sending only switches it back and stays listening
// on both (PREPARED): the coordinator unlistens nobody until no node
// sends the new port. sendOnly on an atomic operation is refused.
func (m *Machine) RollbackScope(ctx context.Context, id, reason string, sendOnly bool) (Record, error) {
	m.lockOp()
	defer m.opMu.Unlock()
	cur := m.current()
	if sendOnly {
		return m.unswitchRequestLocked(id, cur, reason)
	}
	if cur == nil || cur.ID != id {
		if err := m.refuseIfBusyLocked(id); err != nil {
			return Record{}, err
		}
		now := m.clock.Now()
		rec := Record{ID: id, Phase: PhaseAborted, RevertedBy: ByRollback, Ended: now, Updated: now,
			Error: "rolled back before this agent prepared it" + because(reason)}
		m.saveBestEffort(&rec)
		m.setLocked(rec)
		return rec, nil
	}
	switch cur.Phase {
	case PhasePreparing, PhasePrepared:
		return m.abortLocked(ctx, *cur, ByRollback, "rolled back"+because(reason)), nil
	case PhaseCommitted, PhaseConfirmed, PhaseFailed:
		out := m.revertLocked(*cur, ByRollback)
		if out.Phase == PhaseFailed {
			return out, errf(CodeInternal, nil, "operation %s: %s", id, out.Error)
		}
		return out, nil
	case PhaseFinalized:
		return *cur, errf(CodeFailedPrecondition, nil,
			"operation %s is FINALIZED (port %d -> %d, old port's rules removed): run a new operation to change the port back",
			id, cur.FromPort, cur.ToPort)
	}
	return *cur, nil // ABORTED, REVERTED: already rolled back
}

// Finalize removes the old port's firewall rules after a confirmed change.
func (m *Machine) Finalize(ctx context.Context, id string) (Record, error) {
	m.lockOp()
	defer m.opMu.Unlock()
	cur, err := m.sameOpLocked(id)
	if err != nil {
		return Record{}, err
	}
	switch cur.Phase {
	case PhaseConfirmed:
	case PhaseFinalized:
		return cur, nil
	default:
		return cur, errf(CodeFailedPrecondition, nil, "operation %s is %s: finalize needs CONFIRMED", id, cur.Phase)
	}
	if err := m.store.Check(); err != nil {
		return cur, errf(CodeUnavailable, err, "finalize %s refused before any change", id)
	}
	st, err := m.finalizeBackend(ctx, cur)
	if err != nil {
		return cur, errf(CodeInternal, err, "finalize %s (still CONFIRMED; retry Finalize)", id)
	}
	rec := cur
	if rec.Staged() {
		rec.CurrentPort = st.Port
		m.obs.PortObserved(st.Port)
	}
	rec.Phase = PhaseFinalized
	rec.Updated = m.clock.Now()
	rec.Ended = rec.Updated
	m.saveBestEffort(&rec)
	m.setLocked(rec)
	return rec, nil
}
