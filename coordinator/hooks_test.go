package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// recHook records every call it gets as "name point kind from→to" and
// fails or blocks where told. check, when set, runs at every call and
// sees the lab (to assert what the agents have seen at that moment).
type recHook struct {
	name string

	mu    sync.Mutex
	calls []string
	fail  map[string]error                                      // by point
	block map[string]func(ctx context.Context, op OpInfo) error // by point: replaces the call
	check func(point string, op OpInfo)
	probs []string
}

func newRecHook(name string) *recHook {
	return &recHook{name: name, fail: map[string]error{}, block: map[string]func(context.Context, OpInfo) error{}}
}

var _ Hook = (*recHook)(nil)

func (h *recHook) Name() string { return h.name }

func (h *recHook) call(ctx context.Context, point string, op OpInfo) error {
	h.mu.Lock()
	h.calls = append(h.calls, fmt.Sprintf("%s %s %s %d→%d", h.name, point, op.Kind, op.FromPort, op.ToPort))
	err, b, check := h.fail[point], h.block[point], h.check
	h.mu.Unlock()
	if check != nil {
		check(point, op)
	}
	if b != nil {
		return b(ctx, op)
	}
	return err
}

func (h *recHook) Preflight(ctx context.Context, op OpInfo) []string {
	_ = h.call(ctx, "preflight", op)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.probs
}
func (h *recHook) BeforeCommit(ctx context.Context, op OpInfo) error {
	return h.call(ctx, HookBeforeCommit, op)
}
func (h *recHook) AfterConfirm(ctx context.Context, op OpInfo) error {
	return h.call(ctx, HookAfterConfirm, op)
}
func (h *recHook) Finalize(ctx context.Context, op OpInfo) error {
	return h.call(ctx, HookFinalize, op)
}
func (h *recHook) Restore(ctx context.Context, op OpInfo) error { return h.call(ctx, HookRestore, op) }

func (h *recHook) Calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

// shared makes several hooks record into one ordered list.
func shared(hs ...*recHook) func() string {
	var mu sync.Mutex
	var all []string
	for _, h := range hs {
		prev := h.check
		h.check = func(point string, op OpInfo) {
			mu.Lock()
			all = append(all, fmt.Sprintf("%s %s %s %d→%d", h.name, point, op.Kind, op.FromPort, op.ToPort))
			mu.Unlock()
			if prev != nil {
				prev(point, op)
			}
		}
	}
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(all, "\n")
	}
}

func wantCalls(t *testing.T, got func() string, want string) {
	t.Helper()
	want = strings.TrimSpace(strings.ReplaceAll(want, "\t", ""))
	if g := got(); g != want {
		t.Errorf("hook calls:\n%s\nwant:\n%s", g, want)
	}
}

func journalRecord(t *testing.T, dir, id string) Record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "operations", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func marks(r Record) string {
	var s []string
	for _, m := range r.Hooks {
		s = append(s, m.Hook+" "+m.Point+" "+m.State)
	}
	return strings.Join(s, ", ")
}

// TestHooksOrder: every hook point in the contract's order, each once,
// BeforeCommit after every agent prepared and before any Commit, and every
// call journaled.
func TestHooksOrder(t *testing.T) {
	a, b := newRecHook("a"), newRecHook("b")
	var l *lab
	var bad []string
	var badMu sync.Mutex
	a.check = func(point string, _ OpInfo) {
		if point != HookBeforeCommit {
			return
		}
		for n, f := range l.fakes {
			if !strings.Contains(f.Dump(), "PREPARED") || f.Called("Commit") {
				badMu.Lock()
				bad = append(bad, fmt.Sprintf("%s at BeforeCommit: %s %v", n, f.Dump(), f.CallLog()))
				badMu.Unlock()
			}
		}
	}
	calls := shared(a, b)
	l = newLabHooks(t, 3, nil, nil, a, b)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded || rep.Error != "" {
		t.Fatalf("%v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		b preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		b before-commit cutover 4789→4889
		a after-confirm cutover 4789→4889
		b after-confirm cutover 4789→4889
		a finalize cutover 4789→4889
		b finalize cutover 4789→4889`)
	if len(bad) > 0 {
		t.Errorf("BeforeCommit not between prepare and commit: %v", bad)
	}
	if got := marks(journalRecord(t, l.dir, "op1")); got != "a before-commit done, b before-commit done, a after-confirm done, b after-confirm done, a finalize done, b finalize done" {
		t.Errorf("journal hooks: %s", got)
	}
	// Plan and dry run ask Preflight only, and its problems refuse.
	b.probs = []string{"flannel ConfigMap says 8472 but the agents read back 4789"}
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4999})
	if err != nil || len(p.Problems) != 1 || p.Problems[0] != "b: flannel ConfigMap says 8472 but the agents read back 4789" {
		t.Errorf("plan: %v %v", p, err)
	}
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, DryRun: true})
	if err == nil || !strings.Contains(err.Error(), "b: flannel ConfigMap says 8472") {
		t.Errorf("dry run: %v", err)
	}
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "op2"})
	if err == nil || !strings.Contains(err.Error(), "preflight refused") {
		t.Errorf("cutover: %v", err)
	}
	for _, h := range []*recHook{a, b} {
		for _, c := range h.Calls()[4:] {
			if !strings.Contains(c, "preflight") {
				t.Errorf("after op1: %s", c)
			}
		}
	}
	for n, f := range l.fakes {
		for _, c := range f.CallLog() {
			if strings.Contains(c, "op2") {
				t.Errorf("%s got %s after preflight refused op2", n, c)
			}
		}
	}
}

// TestHookBeforeCommitFailureAborts: nothing flipped, no Commit sent, and
// every hook whose BeforeCommit started is restored, in reverse order.
func TestHookBeforeCommitFailureAborts(t *testing.T) {
	a, b, c := newRecHook("a"), newRecHook("b"), newRecHook("c")
	b.fail[HookBeforeCommit] = errors.New("FelixConfiguration default: forbidden")
	calls := shared(a, b, c)
	l := newLabHooks(t, 3, nil, nil, a, b, c)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != aborted || !strings.Contains(rep.Error, "hook b before-commit: FelixConfiguration default: forbidden") {
		t.Fatalf("state %s %q\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	l.nobodyGot("Commit") // I2 and: nothing flipped
	l.everyoneGot("Rollback")
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=ABORTED
		n2 port=4789 op=op1 phase=ABORTED
		n3 port=4789 op=op1 phase=ABORTED`)
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		b preflight cutover 4789→4889
		c preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		b before-commit cutover 4789→4889
		b restore cutover 4789→4889
		a restore cutover 4789→4889`)
	r := journalRecord(t, l.dir, "op1")
	if r.CommitSent || r.Outcome != "aborted" {
		t.Errorf("journal %+v", r)
	}
	if got := marks(r); got != "a before-commit done, b before-commit failed, b restore done, a restore done" {
		t.Errorf("journal hooks: %s", got)
	}
}

// TestHookRestoreAfterRollback: a verification failure after commit rolls
// back and restores; AfterConfirm and Finalize never run.
func TestHookRestoreAfterRollback(t *testing.T) {
	a := newRecHook("a")
	calls := shared(a)
	l := newLabHooks(t, 3, nil, nil, a)
	l.c.run.Verifier = VerifierFunc(func(context.Context, VerifyInput) error { return errors.New("probe mesh: n1→n3 lost 40 of 40") })
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != rolledBack {
		t.Fatalf("%v %v", rep, err)
	}
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		a restore cutover 4789→4889`)
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=REVERTED
		n3 port=4789 op=op1 phase=REVERTED`)
}

// TestHookLateFailuresReported: AfterConfirm and Finalize errors are in the
// report; the operation stays succeeded and nothing is restored.
func TestHookLateFailuresReported(t *testing.T) {
	for _, point := range []string{HookAfterConfirm, HookFinalize} {
		t.Run(point, func(t *testing.T) {
			a, b := newRecHook("a"), newRecHook("b")
			a.fail[point] = errors.New("apiserver: connection refused")
			calls := shared(a, b)
			l := newLabHooks(t, 2, nil, nil, a, b)
			rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			if rep.State != succeeded || rep.Error != "hook a "+point+": apiserver: connection refused" {
				t.Fatalf("state %s error %q", rep.State, rep.Error)
			}
			wantDump(t, l.dump(), `
				n1 port=4889 op=op1 phase=FINALIZED
				n2 port=4889 op=op1 phase=FINALIZED`)
			if strings.Contains(calls(), "restore") || strings.Count(calls(), "b finalize") != 1 || strings.Count(calls(), "b after-confirm") != 1 {
				t.Errorf("calls:\n%s", calls())
			}
			st, _ := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: "op1"})
			if st.GetError() != rep.Error {
				t.Errorf("status error %q", st.GetError())
			}
		})
	}
}

// TestHookReverseCutover: rolling back a succeeded operation is an
// operation of its own whose hooks see the ports swapped.
func TestHookReverseCutover(t *testing.T) {
	a := newRecHook("a")
	calls := shared(a)
	l := newLabHooks(t, 2, nil, nil, a)
	if rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"}); err != nil || rep.State != succeeded {
		t.Fatalf("%v %v", rep, err)
	}
	st, err := l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	rep, _, err := drain(st)
	if err != nil || rep.State != succeeded || rep.Kind != "rollback" {
		t.Fatalf("%v %v", rep, err)
	}
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		a after-confirm cutover 4789→4889
		a finalize cutover 4789→4889
		a preflight rollback 4889→4789
		a before-commit rollback 4889→4789
		a after-confirm rollback 4889→4789
		a finalize rollback 4889→4789`)
}

// TestHookRestartBetweenBeforeCommitAndCommit: the coordinator dies once
// BeforeCommit acted and before Commit went out. The restarted one finds
// it in the journal: it never calls BeforeCommit again, aborts (nothing
// flipped) and calls Restore exactly once.
func TestHookRestartBetweenBeforeCommitAndCommit(t *testing.T) {
	a := newRecHook("a")
	entered := make(chan struct{})
	var once sync.Once
	a.block[HookBeforeCommit] = func(ctx context.Context, _ OpInfo) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-ctx.Done() // the coordinator dies; this call had already acted
		}
		return nil
	}
	calls := shared(a)
	l := newLabHooks(t, 3, nil, nil, a)
	go func() { _, _, _ = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"}) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("BeforeCommit never called")
	}
	l.crash()
	r := journalRecord(t, l.dir, "op1")
	if r.CommitSent || r.Step != "prepare" || marks(r) != "a before-commit done" {
		t.Fatalf("journal after the crash: step %s commit_sent %t hooks %s", r.Step, r.CommitSent, marks(r))
	}
	l.start()
	l.c.Wait()
	st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: "op1"})
	if err != nil || st.State != aborted {
		t.Fatalf("after restart: %v %v", st, err)
	}
	l.nobodyGot("Commit")
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=ABORTED
		n2 port=4789 op=op1 phase=ABORTED
		n3 port=4789 op=op1 phase=ABORTED`)
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		a restore cutover 4789→4889`)
	if got := marks(journalRecord(t, l.dir, "op1")); got != "a before-commit done, a restore done" {
		t.Errorf("journal hooks: %s", got)
	}
	// A third start finds the operation ended: nothing is called again.
	l.crash()
	l.start()
	l.c.Wait()
	if n := strings.Count(calls(), "restore"); n != 1 {
		t.Errorf("Restore called %d times", n)
	}
}

// TestHookNamesUnique: hook names key the journal.
func TestHookNamesUnique(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), Insecure: true}, Inventory{}, WithHook(newRecHook("x")), WithHook(newRecHook("x")))
	if err == nil || !strings.Contains(err.Error(), `name "x" used by an earlier hook`) {
		t.Errorf("duplicate hook names: %v", err)
	}
}

// TestHooksStagedOrder: a staged operation moves the source of truth
// (BeforeCommit) only once every node confirmed sending the new port,
// never while one still sends the old port; a held subset calls no hook
// but preflight, and its continuation calls them all.
func TestHooksStagedOrder(t *testing.T) {
	a := newRecHook("a")
	var l *lab
	var bad []string
	var badMu sync.Mutex
	a.check = func(point string, _ OpInfo) {
		if point != HookBeforeCommit {
			return
		}
		for n, f := range l.fakes {
			if !strings.Contains(f.Dump(), "CONFIRMED") {
				badMu.Lock()
				bad = append(bad, fmt.Sprintf("%s at BeforeCommit: %s", n, f.Dump()))
				badMu.Unlock()
			}
		}
	}
	calls := shared(a)
	l = newLabHooks(t, 3, nil, nil, a)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "s1", Strategy: "staged", Nodes: []string{"n1"}})
	if err != nil || rep.State != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		t.Fatalf("%v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	wantCalls(t, calls, `a preflight cutover 4789→4889`)
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged"})
	if err != nil || rep.State != succeeded || rep.Error != "" {
		t.Fatalf("%v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	wantCalls(t, calls, `
		a preflight cutover 4789→4889
		a before-commit cutover 4789→4889
		a after-confirm cutover 4789→4889
		a finalize cutover 4789→4889`)
	if len(bad) > 0 {
		t.Errorf("BeforeCommit while some node did not send the new port: %v", bad)
	}
}

// planHook is a recHook that also says its steps (Planner) and leaves the
// admin a step once an operation succeeded (NextStepper).
type planHook struct{ *recHook }

func (h planHook) Plan(ctx context.Context, op OpInfo) (steps, problems []string) {
	return []string{fmt.Sprintf("before commit: source of truth to %d", op.ToPort)}, h.Preflight(ctx, op)
}

func (h planHook) NextSteps(op OpInfo) []string {
	return []string{fmt.Sprintf("restart the CNI daemon so that it reads %d", op.ToPort)}
}

// TestHookStepsReachTheAdmin: a Planner's steps are in the plan, each
// named by its hook, its problems still refuse (and Preflight is not asked
// a second time); a NextStepper's steps are in the report of an operation
// that succeeded, and of no other.
func TestHookStepsReachTheAdmin(t *testing.T) {
	p := planHook{newRecHook("cni")}
	plain := newRecHook("plain")
	l := newLabHooks(t, 2, nil, nil, p, plain)
	pr, err := l.c.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(pr.GetHookSteps(), "\n"), "cni: before commit: source of truth to 4889"; got != want {
		t.Errorf("plan hook steps %q, want %q", got, want)
	}
	if n := strings.Count(strings.Join(p.Calls(), "\n"), "preflight"); n != 1 {
		t.Errorf("the Planner hook was asked %d times for one plan, want once: %q", n, p.Calls())
	}

	p.mu.Lock()
	p.probs = []string{"ConfigMap says 8472"}
	p.mu.Unlock()
	pr, err = l.c.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pr.GetProblems(), "cni: ConfigMap says 8472") {
		t.Errorf("a Planner's problem is not in the plan's problems: %q", pr.GetProblems())
	}
	p.mu.Lock()
	p.probs = nil
	p.mu.Unlock()

	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded {
		t.Fatalf("%v %v", rep.GetState(), err)
	}
	if got, want := strings.Join(rep.GetNextSteps(), "\n"), "cni: restart the CNI daemon so that it reads 4889"; got != want {
		t.Errorf("next steps %q, want %q", got, want)
	}

	plain.fail[HookBeforeCommit] = errors.New("forbidden")
	rep, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "op2"})
	if err != nil || rep.State != aborted {
		t.Fatalf("%v %v", rep.GetState(), err)
	}
	if len(rep.GetNextSteps()) != 0 {
		t.Errorf("an aborted operation leaves next steps %q: nothing changed, there is nothing to keep", rep.GetNextSteps())
	}
}
