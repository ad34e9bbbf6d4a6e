package operation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	opA     = "op-a"
	opB     = "op-b"
	from    = tunnelport.Port(4789)
	to      = tunnelport.Port(4889)
	deadman = 10 * time.Second
)

type countObserver struct {
	mu      sync.Mutex
	phases  []Phase
	applied int
	deadman int
	port    tunnelport.Port
}

func (o *countObserver) PhaseChanged(p Phase) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.phases = append(o.phases, p)
}
func (o *countObserver) Applied(time.Duration, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.applied++
}
func (o *countObserver) DeadmanReverted() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deadman++
}
func (o *countObserver) PortObserved(p tunnelport.Port) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.port = p
}
func (o *countObserver) deadmanCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deadman
}

// recordingStore remembers every record saved with the dataplane dump at
// that moment: each is a point at which the agent may crash.
type recordingStore struct {
	FileStore
	be     *dataplane.Fake
	mu     sync.Mutex
	points []savePoint
	fail   atomic.Pointer[error]
}

type savePoint struct {
	rec  Record
	dump string
}

func (s *recordingStore) Save(r Record) error {
	if e := s.fail.Load(); e != nil {
		return &StoreError{Op: "write", Path: s.Path() + ".tmp", Err: *e}
	}
	if err := s.FileStore.Save(r); err != nil {
		return err
	}
	s.mu.Lock()
	s.points = append(s.points, savePoint{r, s.be.Dump()})
	s.mu.Unlock()
	return nil
}

func (s *recordingStore) Check() error {
	if e := s.fail.Load(); e != nil {
		return &StoreError{Op: "write", Path: filepath.Join(s.Dir, ".write-check"), Err: *e}
	}
	return s.FileStore.Check()
}

var quiet = slog.New(slog.DiscardHandler)

type env struct {
	t     *testing.T
	be    *dataplane.Fake
	store *recordingStore
	clock *FakeClock
	obs   *countObserver
	m     *Machine
	hold  time.Duration // Options.AfterCommitHold
}

func newEnv(t *testing.T) *env { return newHoldEnv(t, 0) }

// newHoldEnv is newEnv with an answered commit's after-work held up to
// hold (Options.AfterCommitHold).
func newHoldEnv(t *testing.T, hold time.Duration) *env {
	t.Helper()
	be := dataplane.NewFake("ovs", "vxlan0", from)
	e := &env{t: t, be: be, clock: NewFakeClock(t0), obs: &countObserver{}, hold: hold,
		store: &recordingStore{FileStore: FileStore{Dir: t.TempDir()}, be: be}}
	e.start()
	return e
}

func (e *env) start() {
	e.t.Helper()
	m, err := New(context.Background(), Options{Backend: e.be, Store: e.store, Clock: e.clock,
		PrepareTimeout: 5 * time.Minute, Observer: e.obs, Logger: quiet, AfterCommitHold: e.hold})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.m = m
	e.t.Cleanup(m.Close)
	e.clock.Settle()
}

// memStore is a Store in memory.
type memStore struct {
	mu  sync.Mutex
	rec *Record
}

func (s *memStore) Load() (*Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec, nil
}

func (s *memStore) Save(r Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rec = &r
	return nil
}

func (s *memStore) Check() error { return nil }
func (s *memStore) Path() string { return "memory" }

func newMemEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, be: dataplane.NewFake("ovs", "vxlan0", from), clock: NewFakeClock(t0), obs: &countObserver{}}
	m, err := New(context.Background(), Options{Backend: e.be, Store: &memStore{}, Clock: e.clock, Observer: e.obs, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(m.Close)
	return e
}

func (e *env) phase() Phase {
	r, _ := e.m.Status("")
	return r.Phase
}

func (e *env) wantDump(want string) {
	e.t.Helper()
	if got := e.be.Dump(); got != want {
		e.t.Fatalf("dataplane = %q, want %q", got, want)
	}
}

func (e *env) advance(d time.Duration) {
	e.clock.Advance(d)
	e.clock.Settle()
}

func wantCode(t *testing.T, err error, code Code, substr ...string) {
	t.Helper()
	if code == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if CodeOf(err) != code {
		t.Fatalf("error %v: code %d, want %d", err, CodeOf(err), code)
	}
	for _, s := range substr {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

const (
	dumpIdle      = "port=4789 fw=[4789]"
	dumpPrepared  = "port=4789 fw=[4789 4889]"
	dumpCommitted = "port=4889 fw=[4789 4889]"
	dumpFinalized = "port=4889 fw=[4889]"
)

func TestHappyPath(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r, err := e.m.Prepare(ctx, opA, from, to)
	wantCode(t, err, 0)
	if r.Phase != PhasePrepared || !r.PrepareDeadline.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("prepare: %+v", r)
	}
	e.wantDump(dumpPrepared)

	at := t0.Add(2 * time.Second)
	r, err = e.m.Commit(ctx, opA, at, deadman)
	wantCode(t, err, 0)
	if r.Phase != PhaseCommitted || !r.Applied.Equal(at) || !r.Deadline.Equal(at.Add(deadman)) || r.ReadbackPort != to {
		t.Fatalf("commit: %+v", r)
	}
	if got := e.clock.Pending(); len(got) != 1 || !got[0].Equal(at.Add(deadman)) {
		t.Fatalf("timers after commit = %v, want only the dead-man at %v", got, at.Add(deadman))
	}
	e.wantDump(dumpCommitted)

	r, err = e.m.Confirm(ctx, opA)
	wantCode(t, err, 0)
	if r.Phase != PhaseConfirmed || len(e.clock.Pending()) != 0 {
		t.Fatalf("confirm: %+v, timers %v", r, e.clock.Pending())
	}
	e.advance(time.Hour) // nothing fires any more
	r, err = e.m.Finalize(ctx, opA)
	wantCode(t, err, 0)
	if r.Phase != PhaseFinalized {
		t.Fatalf("finalize: %+v", r)
	}
	e.wantDump(dumpFinalized)
	if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Commit 4789->4889", "Finalize 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %q, want %q", got, want)
	}
	// A finished operation does not block the next one.
	_, err = e.m.Prepare(ctx, opB, to, from)
	wantCode(t, err, 0)
}

// TestTransitions drives the machine to a phase with setup steps, then
// applies one call and checks the outcome, the phase and the dataplane.
func TestTransitions(t *testing.T) {
	ctx := context.Background()
	type step func(e *env) error
	prepare := func(id string, f, tt tunnelport.Port) step {
		return func(e *env) error { _, err := e.m.Prepare(ctx, id, f, tt); return err }
	}
	commit := func(id string) step {
		return func(e *env) error { _, err := e.m.Commit(ctx, id, time.Time{}, deadman); return err }
	}
	confirm := func(id string) step { return func(e *env) error { _, err := e.m.Confirm(ctx, id); return err } }
	rollback := func(id string) step {
		return func(e *env) error { _, err := e.m.Rollback(ctx, id, "test"); return err }
	}
	finalize := func(id string) step { return func(e *env) error { _, err := e.m.Finalize(ctx, id); return err } }
	expire := func(e *env) error { e.advance(deadman); return nil }
	failNext := func(method string) step {
		return func(e *env) error { e.be.FailNext(method, errors.New("injected")); return nil }
	}
	var (
		prepared  = []step{prepare(opA, from, to)}
		committed = []step{prepare(opA, from, to), commit(opA)}
		confirmed = []step{prepare(opA, from, to), commit(opA), confirm(opA)}
		finalized = []step{prepare(opA, from, to), commit(opA), confirm(opA), finalize(opA)}
		deadmaned = []step{prepare(opA, from, to), commit(opA), expire}
		aborted   = []step{prepare(opA, from, to), rollback(opA)}
		reverted  = []step{prepare(opA, from, to), commit(opA), rollback(opA)}
	)
	cases := []struct {
		name   string
		setup  []step
		do     step
		code   Code
		substr []string
		phase  Phase
		dump   string
	}{
		{"prepare from idle", nil, prepare(opA, from, to), 0, nil, PhasePrepared, dumpPrepared},
		{"prepare replay", prepared, prepare(opA, from, to), 0, nil, PhasePrepared, dumpPrepared},
		{"prepare replay other ports", prepared, prepare(opA, from, 4999), CodeInvalidArgument, []string{opA, "4789 -> 4889", "4789 -> 4999"}, PhasePrepared, dumpPrepared},
		{"prepare replay when committed", committed, prepare(opA, from, to), 0, nil, PhaseCommitted, dumpCommitted},
		{"prepare other op while prepared", prepared, prepare(opB, from, to), CodeFailedPrecondition, []string{opA, "in flight", opB}, PhasePrepared, dumpPrepared},
		{"prepare other op while committed", committed, prepare(opB, from, to), CodeFailedPrecondition, []string{opA}, PhaseCommitted, dumpCommitted},
		{"prepare other op while confirmed", confirmed, prepare(opB, from, to), CodeFailedPrecondition, []string{opA}, PhaseConfirmed, dumpCommitted},
		{"prepare other op after finalize", finalized, prepare(opB, to, 4999), 0, nil, PhasePrepared, "port=4889 fw=[4889 4999]"},
		{"prepare other op after abort", aborted, prepare(opB, from, to), 0, nil, PhasePrepared, dumpPrepared},
		{"prepare wrong from port", nil, prepare(opA, 1234, to), CodeFailedPrecondition, []string{"snapshot", "nothing changed"}, PhaseIdle, dumpIdle},
		{"prepare backend fails", []step{failNext(dataplane.MethodPrepare)}, prepare(opA, from, to), CodeAborted, []string{"injected", "aborted"}, PhaseAborted, dumpIdle},
		{"prepare and abort fail", []step{failNext(dataplane.MethodPrepare), failNext(dataplane.MethodAbort)}, prepare(opA, from, to), CodeInternal, []string{"abort"}, PhaseFailed, dumpIdle},
		{"prepare replay after aborted prepare", []step{failNext(dataplane.MethodPrepare), prepare(opA, from, to)}, prepare(opA, from, to), CodeAborted, []string{"injected"}, PhaseAborted, dumpIdle},
		{"prepare replay after rollback", aborted, prepare(opA, from, to), CodeFailedPrecondition, []string{"aborted by rollback"}, PhaseAborted, dumpIdle},
		{"commit unknown op", nil, commit(opA), CodeNotFound, []string{opA}, PhaseIdle, dumpIdle},
		{"commit other op", prepared, commit(opB), CodeFailedPrecondition, []string{opA, "in flight"}, PhasePrepared, dumpPrepared},
		{"commit replay", committed, commit(opA), 0, nil, PhaseCommitted, dumpCommitted},
		{"commit replay when confirmed", confirmed, commit(opA), 0, nil, PhaseConfirmed, dumpCommitted},
		{"commit after deadman", deadmaned, commit(opA), CodeFailedPrecondition, []string{"reverted by deadman"}, PhaseReverted, dumpIdle},
		{"commit after abort", aborted, commit(opA), CodeFailedPrecondition, []string{"aborted"}, PhaseAborted, dumpIdle},
		{"commit apply fails", []step{prepare(opA, from, to), failNext(dataplane.MethodCommit)}, commit(opA), CodeAborted, []string{"injected", "reverted to port 4789"}, PhaseReverted, dumpIdle},
		{"commit apply and revert fail", []step{prepare(opA, from, to), failNext(dataplane.MethodCommit), failNext(dataplane.MethodRevert)}, commit(opA), CodeInternal, []string{"revert"}, PhaseFailed, dumpPrepared},
		{"confirm prepared", prepared, confirm(opA), CodeFailedPrecondition, []string{"not committed"}, PhasePrepared, dumpPrepared},
		{"confirm committed", committed, confirm(opA), 0, nil, PhaseConfirmed, dumpCommitted},
		{"confirm replay", confirmed, confirm(opA), 0, nil, PhaseConfirmed, dumpCommitted},
		{"confirm after deadman", deadmaned, confirm(opA), CodeFailedPrecondition, []string{"already reverted by deadman at 2030-01-02T03:04:15Z"}, PhaseReverted, dumpIdle},
		{"confirm after rollback", reverted, confirm(opA), CodeFailedPrecondition, []string{"already reverted by rollback"}, PhaseReverted, dumpIdle},
		{"rollback prepared", prepared, rollback(opA), 0, nil, PhaseAborted, dumpIdle},
		{"rollback committed", committed, rollback(opA), 0, nil, PhaseReverted, dumpIdle},
		{"rollback confirmed", confirmed, rollback(opA), 0, nil, PhaseReverted, dumpIdle},
		{"rollback replay aborted", aborted, rollback(opA), 0, nil, PhaseAborted, dumpIdle},
		{"rollback replay reverted", reverted, rollback(opA), 0, nil, PhaseReverted, dumpIdle},
		{"rollback after deadman", deadmaned, rollback(opA), 0, nil, PhaseReverted, dumpIdle},
		{"rollback finalized", finalized, rollback(opA), CodeFailedPrecondition, []string{"FINALIZED"}, PhaseFinalized, dumpFinalized},
		{"rollback other op in flight", prepared, rollback(opB), CodeFailedPrecondition, []string{opA}, PhasePrepared, dumpPrepared},
		{"rollback never-seen op", nil, rollback(opB), 0, nil, PhaseAborted, dumpIdle},
		{"prepare after never-seen rollback", []step{rollback(opA)}, prepare(opA, from, to), CodeFailedPrecondition, []string{"aborted by rollback"}, PhaseAborted, dumpIdle},
		{"rollback failed retries revert", []step{prepare(opA, from, to), commit(opA), failNext(dataplane.MethodRevert), rollback(opA)}, rollback(opA), 0, nil, PhaseReverted, dumpIdle},
		{"finalize committed", committed, finalize(opA), CodeFailedPrecondition, []string{"needs CONFIRMED"}, PhaseCommitted, dumpCommitted},
		{"finalize fails stays confirmed", []step{prepare(opA, from, to), commit(opA), confirm(opA), failNext(dataplane.MethodFinalize)}, finalize(opA), CodeInternal, []string{"retry Finalize"}, PhaseConfirmed, dumpCommitted},
		{"finalize replay", finalized, finalize(opA), 0, nil, PhaseFinalized, dumpFinalized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			for i, s := range c.setup {
				_ = i
				_ = s(e) // setup steps may fail on purpose
			}
			err := c.do(e)
			wantCode(t, err, c.code, c.substr...)
			e.clock.Settle()
			if got := e.phase(); got != c.phase {
				t.Fatalf("phase = %s, want %s", got, c.phase)
			}
			e.wantDump(c.dump)
		})
	}
}

func TestReplayHasNoSecondEffect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for range 3 {
		if _, err := e.m.Prepare(ctx, opA, from, to); err != nil {
			t.Fatal(err)
		}
	}
	var first Record
	for i := range 3 {
		r, err := e.m.Commit(ctx, opA, t0.Add(time.Second), deadman)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r
		} else if r.Applied != first.Applied || r.Deadline != first.Deadline {
			t.Fatalf("commit replay %d returned %+v, first %+v", i, r, first)
		}
	}
	for range 2 {
		if _, err := e.m.Confirm(ctx, opA); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Commit 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %q, want %q", got, want)
	}
}

func TestDeadmanRevertsAndIsCounted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.m.Prepare(ctx, opA, from, to)
	if _, err := e.m.Commit(ctx, opA, time.Time{}, deadman); err != nil {
		t.Fatal(err)
	}
	e.advance(deadman - time.Millisecond)
	if e.phase() != PhaseCommitted {
		t.Fatalf("reverted before the deadline: %s", e.phase())
	}
	e.advance(time.Millisecond)
	r, _ := e.m.Status(opA)
	if r.Phase != PhaseReverted || r.RevertedBy != ByDeadman || r.CurrentPort != from || !r.Ended.Equal(t0.Add(deadman)) {
		t.Fatalf("after deadline: %+v", r)
	}
	e.wantDump(dumpIdle)
	if e.obs.deadmanCount() != 1 {
		t.Fatalf("deadman reverts observed = %d", e.obs.deadmanCount())
	}
}

func TestPrepareTimeoutAborts(t *testing.T) {
	e := newEnv(t)
	e.m.Prepare(context.Background(), opA, from, to)
	e.advance(5 * time.Minute)
	r, _ := e.m.Status("")
	if r.Phase != PhaseAborted || r.RevertedBy != ByPrepareTimeout || !strings.Contains(r.Error, "prepare timeout 5m0s") {
		t.Fatalf("after prepare timeout: %+v", r)
	}
	e.wantDump(dumpIdle)
}

// TestDeadmanConfirmRace fires the dead-man and Confirm at the same time,
// many times: exactly one wins, and the dataplane agrees with the winner.
func TestDeadmanConfirmRace(t *testing.T) {
	ctx := context.Background()
	wins := map[string]int{}
	for i := range 1000 {
		e := newMemEnv(t) // no fsync: this test is about the lock, not the disk
		e.m.Prepare(ctx, opA, from, to)
		if _, err := e.m.Commit(ctx, opA, time.Time{}, deadman); err != nil {
			t.Fatal(err)
		}
		var confirmErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); e.clock.Advance(deadman) }()
		go func() { defer wg.Done(); _, confirmErr = e.m.Confirm(ctx, opA) }()
		wg.Wait()
		e.clock.Settle()
		r, _ := e.m.Status(opA)
		reverts := 0
		for _, c := range e.be.Calls() {
			if strings.HasPrefix(c, "Revert") {
				reverts++
			}
		}
		if confirmErr == nil {
			wins["confirm"]++
			if r.Phase != PhaseConfirmed || reverts != 0 || e.be.Port() != to || e.obs.deadmanCount() != 0 {
				t.Fatalf("iteration %d: confirm won but phase %s, %d reverts, port %d", i, r.Phase, reverts, e.be.Port())
			}
		} else {
			wins["deadman"]++
			wantCode(t, confirmErr, CodeFailedPrecondition, "already reverted by deadman")
			if r.Phase != PhaseReverted || reverts != 1 || e.be.Port() != from || e.obs.deadmanCount() != 1 {
				t.Fatalf("iteration %d: deadman won but phase %s, %d reverts, port %d", i, r.Phase, reverts, e.be.Port())
			}
		}
		e.m.Close()
	}
	t.Logf("winners over 1000 races: %v", wins)
}

// TestRestartAtEveryPersistedPoint runs a full operation, then for every
// record the agent persisted, simulates a crash right after that write: a
// new machine over that record and the dataplane as it was then must resume
// exactly.
func TestRestartAtEveryPersistedPoint(t *testing.T) {
	ctx := context.Background()
	ref := newEnv(t)
	ref.m.Prepare(ctx, opA, from, to)
	ref.m.Commit(ctx, opA, t0.Add(time.Second), deadman)
	ref.m.Confirm(ctx, opA)
	ref.m.Finalize(ctx, opA)
	points := ref.store.points
	var phases []Phase
	for _, p := range points {
		phases = append(phases, p.rec.Phase)
	}
	want := []Phase{PhasePreparing, PhasePrepared, PhaseCommitted, PhaseCommitted, PhaseConfirmed, PhaseFinalized}
	if !slices.Equal(phases, want) {
		t.Fatalf("persisted phases %v, want %v", phases, want)
	}
	if points[2].dump != dumpPrepared || points[3].dump != dumpCommitted {
		t.Fatalf("COMMITTED must be persisted before the apply: dumps %q, %q", points[2].dump, points[3].dump)
	}

	for i, p := range points {
		for _, later := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%d-%s-after-%s", i, p.rec.Phase, later), func(t *testing.T) {
				e := resumeFrom(t, p, p.rec.Updated.Add(later))
				r, _ := e.m.Status("")
				switch p.rec.Phase {
				case PhasePreparing:
					if r.Phase != PhaseAborted || r.RevertedBy != ByRestart {
						t.Fatalf("resumed %+v", r)
					}
					e.wantDump(dumpIdle)
				case PhasePrepared:
					if later > 0 { // the prepare timeout passed while down
						e.clock.Settle()
						r, _ = e.m.Status("")
						if r.Phase != PhaseAborted || r.RevertedBy != ByPrepareTimeout {
							t.Fatalf("resumed late: %+v", r)
						}
						e.wantDump(dumpIdle)
						return
					}
					if r.Phase != PhasePrepared || !slices.Equal(e.clock.Pending(), []time.Time{p.rec.PrepareDeadline}) {
						t.Fatalf("resumed %+v timers %v", r, e.clock.Pending())
					}
					if _, err := e.m.Commit(ctx, opA, time.Time{}, deadman); err != nil {
						t.Fatalf("commit after restart: %v", err)
					}
					e.wantDump(dumpCommitted)
				case PhaseCommitted:
					if later > 0 {
						if r.Phase != PhaseReverted || r.RevertedBy != ByDeadman {
							t.Fatalf("resumed past the deadline: %+v", r)
						}
						e.wantDump(dumpIdle)
						return
					}
					if r.Phase != PhaseCommitted || !slices.Equal(e.clock.Pending(), []time.Time{p.rec.Deadline}) {
						t.Fatalf("resumed %+v timers %v", r, e.clock.Pending())
					}
					e.advance(p.rec.Deadline.Sub(e.clock.Now()))
					r, _ = e.m.Status("")
					if r.Phase != PhaseReverted || r.RevertedBy != ByDeadman {
						t.Fatalf("after deadline: %+v", r)
					}
					e.wantDump(dumpIdle)
				case PhaseConfirmed:
					e.advance(time.Hour)
					if r.Phase != PhaseConfirmed || len(e.clock.Pending()) != 0 {
						t.Fatalf("resumed %+v", r)
					}
					if _, err := e.m.Finalize(ctx, opA); err != nil {
						t.Fatal(err)
					}
					e.wantDump(dumpFinalized)
				case PhaseFinalized:
					if r.Phase != PhaseFinalized || e.be.Dump() != dumpFinalized || len(e.be.Calls()) != 0 {
						t.Fatalf("resumed %+v calls %q", r, e.be.Calls())
					}
				}
			})
		}
	}
}

// resumeFrom builds a machine over a state dir holding p's record and a
// dataplane as p's dump says, at clock now.
func resumeFrom(t *testing.T, p savePoint, now time.Time) *env {
	t.Helper()
	var port tunnelport.Port
	var fw string
	if _, err := fmt.Sscanf(p.dump, "port=%d fw=[%s", &port, &fw); err != nil {
		t.Fatalf("parse dump %q: %v", p.dump, err)
	}
	be := dataplane.NewFake("ovs", "vxlan0", port)
	var open []tunnelport.Port
	for _, f := range strings.Fields(strings.Trim(p.dump[strings.Index(p.dump, "[")+1:], "]")) {
		var n tunnelport.Port
		fmt.Sscan(f, &n)
		open = append(open, n)
	}
	be.SetFirewall(open...)
	if be.Dump() != p.dump {
		t.Fatalf("rebuilt dataplane %q, want %q", be.Dump(), p.dump)
	}
	dir := t.TempDir()
	if err := (FileStore{Dir: dir}).Save(p.rec); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, be: be, clock: NewFakeClock(now), obs: &countObserver{},
		store: &recordingStore{FileStore: FileStore{Dir: dir}, be: be}}
	e.start()
	return e
}

func TestUnwritableStoreRefusesBeforeAnyEffect(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	erofs := error(syscall.EROFS)
	e.store.fail.Store(&erofs)
	_, err := e.m.Prepare(ctx, opA, from, to)
	wantCode(t, err, CodeUnavailable, e.store.Dir, "read-only file system", "EROFS")
	if len(e.be.Calls()) != 0 {
		t.Fatalf("dataplane touched: %q", e.be.Calls())
	}
	e.wantDump(dumpIdle)
	if nr := e.m.NotReady(); len(nr) != 1 || !strings.Contains(nr[0], "EROFS") {
		t.Fatalf("NotReady = %q", nr)
	}

	// Commit and Confirm refuse too; the dead-man still reverts.
	e.store.fail.Store(nil)
	e.m.Prepare(ctx, opA, from, to)
	e.store.fail.Store(&erofs)
	_, err = e.m.Commit(ctx, opA, time.Time{}, deadman)
	wantCode(t, err, CodeUnavailable, "refused before any change")
	e.wantDump(dumpPrepared)
	e.store.fail.Store(nil)
	e.m.Commit(ctx, opA, time.Time{}, deadman)
	e.store.fail.Store(&erofs)
	_, err = e.m.Confirm(ctx, opA)
	wantCode(t, err, CodeUnavailable, "dead-man timer stays armed")
	e.advance(deadman)
	if r, _ := e.m.Status(""); r.Phase != PhaseReverted || !strings.Contains(r.Error, "not persisted") {
		t.Fatalf("after deadline with a failing store: %+v", r)
	}
	e.wantDump(dumpIdle)
}

func TestFileStoreErrorsNamePathAndErrno(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := FileStore{Dir: filepath.Join(file, "state")}
	err := s.Check()
	if err == nil || !strings.Contains(err.Error(), s.Dir) || !strings.Contains(err.Error(), "ENOTDIR") {
		t.Fatalf("Check = %v, want the path and ENOTDIR", err)
	}
	if !IsStoreError(err) {
		t.Fatalf("IsStoreError(%v) = false", err)
	}
}

func TestFileStoreRoundTripAndCorruption(t *testing.T) {
	dir := t.TempDir()
	s := FileStore{Dir: dir}
	if r, err := s.Load(); r != nil || err != nil {
		t.Fatalf("empty dir: %v %v", r, err)
	}
	snap := dataplane.Snapshot{Backend: "ovs", Device: "vxlan0", FromPort: from, ToPort: to, Data: []byte(`{"x":1}`)}
	in := Record{ID: opA, Phase: PhaseCommitted, FromPort: from, ToPort: to, Snapshot: &snap,
		Deadline: t0.Add(deadman), Deadman: deadman, Updated: t0}
	if err := s.Save(in); err != nil {
		t.Fatal(err)
	}
	out, err := s.Load()
	var data bytes.Buffer
	if err == nil {
		err = json.Compact(&data, out.Snapshot.Data)
	}
	if err != nil || !out.Deadline.Equal(in.Deadline) || data.String() != `{"x":1}` || out.Phase != PhaseCommitted {
		t.Fatalf("round trip: %+v %v", out, err)
	}
	if ents, err := os.ReadDir(s.Dir); err != nil || len(ents) != 1 {
		t.Fatalf("state dir holds %v (%v), want only %s: a temporary file left behind?", ents, err, StateFile)
	}
	os.WriteFile(s.Path(), []byte("{not json"), 0o600)
	if _, err := New(context.Background(), Options{Backend: dataplane.NewFake("ovs", "vxlan0", from), Store: s, Logger: quiet}); err == nil ||
		!strings.Contains(err.Error(), s.Path()) {
		t.Fatalf("New over a corrupt record = %v, want an error naming %s", err, s.Path())
	}
	os.WriteFile(s.Path(), []byte(`{"id":"x","phase":"COMMITTED"}`), 0o600)
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Fatalf("record without snapshot: %v", err)
	}
}

// frozenClock is a FakeClock whose SleepUntil oversleeps by freeze: the
// agent was stopped (SIGSTOP) while it waited for the commit instant.
type frozenClock struct {
	*FakeClock
	freeze time.Duration
}

func (c frozenClock) SleepUntil(at time.Time) time.Duration {
	c.FakeClock.SleepUntil(at)
	c.Advance(c.freeze)
	return c.Now().Sub(at)
}

// An agent that reaches the commit instant later than its
// lateness budget applies nothing and aborts (the coordinator rolled the
// others back); within the budget, or with no budget, it applies.
func TestCommitLateBudget(t *testing.T) {
	ctx := context.Background()
	const budget = 200 * time.Millisecond
	for _, tc := range []struct {
		name          string
		arrive        time.Duration // the request comes this long after t0; the instant is t0+1s
		freeze        time.Duration // stopped while it waited for the instant
		budget        time.Duration
		wantApplied   bool
		wantLatenessD time.Duration
	}{
		{name: "on time", arrive: 0, budget: budget, wantApplied: true},
		{name: "within budget", arrive: 1100 * time.Millisecond, budget: budget, wantApplied: true, wantLatenessD: 100 * time.Millisecond},
		{name: "request past budget", arrive: 7 * time.Second, budget: budget},
		{name: "frozen while waiting", freeze: 6 * time.Second, budget: budget},
		{name: "no budget applies however late", freeze: 6 * time.Second, wantApplied: true, wantLatenessD: 6 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.m.Close()
			fc := frozenClock{FakeClock: e.clock, freeze: tc.freeze}
			m, err := New(ctx, Options{Backend: e.be, Store: e.store, Clock: fc, PrepareTimeout: 5 * time.Minute, Observer: e.obs, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			if _, err := m.Prepare(ctx, opA, from, to); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(tc.arrive)
			at := t0.Add(time.Second)
			r, err := m.CommitWithin(ctx, opA, at, deadman, tc.budget, time.Time{})
			if tc.wantApplied {
				wantCode(t, err, 0)
				if r.Phase != PhaseCommitted || r.Lateness != tc.wantLatenessD {
					t.Fatalf("commit: phase %s lateness %s, want COMMITTED %s", r.Phase, r.Lateness, tc.wantLatenessD)
				}
				e.wantDump(dumpCommitted)
				return
			}
			wantCode(t, err, CodeAborted, "late by", "not applied", "still on port 4789")
			if d := LateOf(err); d <= tc.budget {
				t.Errorf("the refusal carries lateness %s, want past the budget %s (the coordinator reports the node late by it)", d, tc.budget)
			}
			if r.Phase != PhaseAborted || r.RevertedBy != ByLate {
				t.Fatalf("late commit: %+v, want ABORTED by %s", r, ByLate)
			}
			if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Abort 4789->4889"}; !slices.Equal(got, want) {
				t.Fatalf("calls = %q, want %q: nothing applied", got, want)
			}
			// The coordinator's rollback that follows is harmless.
			if r, err := m.Rollback(ctx, opA, "late"); err != nil || r.Phase != PhaseAborted {
				t.Fatalf("rollback after a late refusal: %+v %v", r, err)
			}
		})
	}
}

// A commit call whose caller already gave up (ctx done: the coordinator's
// deadline passed while this agent was frozen) applies nothing, even with
// no lateness budget (the wait policy): the coordinator has counted the
// node away, and a flip now would be this node's alone.
func TestCommitAbandonedByItsCallerIsNotApplied(t *testing.T) {
	e := newEnv(t)
	if _, err := e.m.Prepare(context.Background(), opA, from, to); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := e.m.CommitWithin(ctx, opA, t0.Add(time.Second), deadman, 0, time.Time{})
	wantCode(t, err, CodeAborted, "caller gave up", "not applied", "still on port 4789")
	if r.Phase != PhaseAborted {
		t.Fatalf("abandoned commit: %+v, want ABORTED", r)
	}
	if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Abort 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %q, want %q: nothing applied", got, want)
	}
}

// The same when the call is read after the caller's own deadline (abandon,
// in the agent's clock) although its context is live: a call read late
// gets a context deadline counted from its reading, so only the caller's
// instant tells. Before that instant, however late for the commit instant,
// the wait policy's commit applies.
func TestCommitPastItsCallersDeadlineIsNotApplied(t *testing.T) {
	for _, tc := range []struct {
		name    string
		abandon time.Duration // after t0; the call is read at t0+40s
		applied bool
	}{{"read after the caller gave up", 30 * time.Second, false}, {"read while the caller waits", 60 * time.Second, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if _, err := e.m.Prepare(context.Background(), opA, from, to); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(40 * time.Second)
			r, err := e.m.CommitWithin(context.Background(), opA, t0.Add(time.Second), deadman, 0, t0.Add(tc.abandon))
			if tc.applied {
				wantCode(t, err, 0)
				if r.Phase != PhaseCommitted {
					t.Fatalf("commit within the caller's deadline: %+v, want COMMITTED", r)
				}
				return
			}
			wantCode(t, err, CodeAborted, "caller gave up", "deadline passed 10s ago", "not applied")
			if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Abort 4789->4889"}; !slices.Equal(got, want) {
				t.Fatalf("calls = %q, want %q: nothing applied", got, want)
			}
		})
	}
}

// The agent took the call in time and was stopped while it waited for the
// instant, past its caller's deadline (the wait policy: no lateness
// budget): it applies nothing when it wakes.
func TestCommitFrozenPastItsCallersDeadlineIsNotApplied(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.m.Close()
	m, err := New(ctx, Options{Backend: e.be, Store: e.store, Clock: frozenClock{FakeClock: e.clock, freeze: 30 * time.Second}, PrepareTimeout: 5 * time.Minute, Observer: e.obs, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if _, err := m.Prepare(ctx, opA, from, to); err != nil {
		t.Fatal(err)
	}
	r, err := m.CommitWithin(ctx, opA, t0.Add(time.Second), deadman, 0, t0.Add(6*time.Second))
	wantCode(t, err, CodeAborted, "after its caller gave up", "not applied", "still on port 4789")
	if r.Phase != PhaseAborted {
		t.Fatalf("commit woken past its caller's deadline: %+v, want ABORTED", r)
	}
	if got, want := e.be.Calls(), []string{"Prepare 4789->4889", "Abort 4789->4889"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %q, want %q: nothing applied", got, want)
	}
}

// armingFake is a Backend that can arm its commits, recording when.
type armingFake struct {
	*dataplane.Fake
	clock *FakeClock
	armed []time.Time
}

func (a *armingFake) ArmCommit(ctx context.Context, s dataplane.Snapshot) error {
	if _, ok := ctx.Deadline(); !ok {
		return errors.New("no deadline")
	}
	a.armed = append(a.armed, a.clock.Now())
	return nil
}

// TestCommitArmsAheadOfTheInstant: a backend that can read ahead is armed
// once, while the agent waits for the instant; a commit with too little
// time left before its instant (or none) is not armed.
func TestCommitArmsAheadOfTheInstant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lead  time.Duration
		armed int
	}{
		{"lead 400ms", 400 * time.Millisecond, 1},
		{"lead 30ms", 30 * time.Millisecond, 0},
		{"no instant", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewFakeClock(t0)
			be := &armingFake{Fake: dataplane.NewFake("kernel-vxlan", "flannel.1", from), clock: clock}
			m, err := New(context.Background(), Options{Backend: be, Store: &memStore{}, Clock: clock, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			ctx := context.Background()
			_, err = m.Prepare(ctx, opA, from, to)
			wantCode(t, err, 0)
			var at time.Time
			if tc.lead > 0 {
				at = clock.Now().Add(tc.lead)
			}
			r, err := m.Commit(ctx, opA, at, deadman)
			wantCode(t, err, 0)
			if len(be.armed) != tc.armed {
				t.Fatalf("armed %d times, want %d", len(be.armed), tc.armed)
			}
			if tc.armed > 0 && !be.armed[0].Before(at) {
				t.Fatalf("armed at %v, not before the instant %v", be.armed[0], at)
			}
			if r.ReadbackPort != to {
				t.Fatalf("commit: %+v", r)
			}
		})
	}
}
