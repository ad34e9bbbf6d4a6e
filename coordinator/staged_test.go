package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// invariantPlanes wraps the fake dataplanes of every node and checks the
// staged invariant at every call, against every node's state at that
// moment: a node switches to sending the new port only while every node
// receives it, stops receiving it only while no node sends it, and
// retires the old port only once every node sends the new one.
type invariantPlanes struct {
	mu     sync.Mutex
	planes map[string]*dataplane.Fake
	broken []string
	// hold keeps each listen, switch and retire busy that long; busy and
	// maxBusy count how many nodes were inside one at once (the waves).
	hold          time.Duration
	busy, maxBusy int
}

// changing marks a node inside a datapath change until the returned func.
func (p *invariantPlanes) changing() func() {
	p.mu.Lock()
	p.busy++
	p.maxBusy = max(p.maxBusy, p.busy)
	hold := p.hold
	p.mu.Unlock()
	time.Sleep(hold)
	return func() {
		p.mu.Lock()
		p.busy--
		p.mu.Unlock()
	}
}

func (c *checkedPlane) Listen(ctx context.Context, s dataplane.Snapshot) error {
	defer c.all.changing()()
	return c.Fake.Listen(ctx, s)
}

type checkedPlane struct {
	*dataplane.Fake
	node string
	all  *invariantPlanes
}

func (p *invariantPlanes) backend(node string) dataplane.Backend {
	f := dataplane.NewFake("ovs", "vxlan0", fromPort)
	p.mu.Lock()
	p.planes[node] = f
	p.mu.Unlock()
	return &checkedPlane{Fake: f, node: node, all: p}
}

// wantAll checks that every node's dataplane dumps want (when says at
// what point of the test).
func (p *invariantPlanes) wantAll(t *testing.T, want, when string) {
	t.Helper()
	for node, f := range p.planes {
		if got := f.Dump(); got != want {
			t.Errorf("%s: %s %s, want %s", node, got, when, want)
		}
	}
}

// wantIntact fails t when the invariant was broken at any dataplane call.
func (p *invariantPlanes) wantIntact(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.broken) > 0 {
		t.Fatalf("staged invariant broken:\n%s", strings.Join(p.broken, "\n"))
	}
}

func (p *invariantPlanes) check(node, call string, ok func(other *dataplane.Fake) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, f := range p.planes {
		if !ok(f) {
			p.broken = append(p.broken, fmt.Sprintf("%s %s while %s is %s", node, call, n, f.Dump()))
		}
	}
}

func (c *checkedPlane) SwitchSend(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	c.all.check(c.node, "switches to sending "+fmt.Sprint(s.ToPort), func(o *dataplane.Fake) bool { return slices.Contains(o.Receives(), s.ToPort) })
	defer c.all.changing()()
	return c.Fake.SwitchSend(ctx, s)
}

func (c *checkedPlane) Unlisten(ctx context.Context, s dataplane.Snapshot) error {
	c.all.check(c.node, "stops receiving "+fmt.Sprint(s.ToPort), func(o *dataplane.Fake) bool { return o.Sends() != s.ToPort })
	return c.Fake.Unlisten(ctx, s)
}

func (c *checkedPlane) Retire(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	c.all.check(c.node, "retires "+fmt.Sprint(s.FromPort), func(o *dataplane.Fake) bool { return o.Sends() == s.ToPort })
	defer c.all.changing()()
	return c.Fake.Retire(ctx, s)
}

// TestRealAgentsStagedWaves: listen, switch and retire change at most
// max_parallel nodes at a time; the count bites (all at once is seen as
// such), and the report says the wave size as run (auto: a tenth, at
// least one).
func TestRealAgentsStagedWaves(t *testing.T) {
	const n = 6
	inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}, hold: 30 * time.Millisecond}
	l := realAgentsWith(t, n, inv.backend)
	for _, tc := range []struct {
		id             string
		port, parallel uint32
		wantReport     uint32
		check          func(maxBusy int) bool
		want           string
	}{
		{"w2", 4889, 2, 2, func(m int) bool { return m == 2 }, "exactly 2"},
		{"wauto", 4989, 0, 1, func(m int) bool { return m == 1 }, "1"},
		// The bite: every node at once is seen as more than two.
		{"wall", 5089, n, n, func(m int) bool { return m > 2 }, "more than 2"},
	} {
		inv.mu.Lock()
		inv.maxBusy = 0
		inv.mu.Unlock()
		rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: tc.port, OperationId: tc.id, Strategy: "staged", Batches: []string{"1", "100%"}, MaxParallel: tc.parallel})
		if err != nil || rep.State != succeeded {
			t.Fatalf("%s: %v %v\n%s", tc.id, rep, err, strings.Join(msgs, "\n"))
		}
		inv.mu.Lock()
		got := inv.maxBusy
		inv.mu.Unlock()
		if !tc.check(got) {
			t.Errorf("%s: max_parallel %d: %d node(s) changed at once, want %s", tc.id, tc.parallel, got, tc.want)
		}
		if rep.MaxParallel != tc.wantReport {
			t.Errorf("%s: report max_parallel %d, want %d", tc.id, rep.MaxParallel, tc.wantReport)
		}
	}
	if len(inv.broken) > 0 {
		t.Fatalf("invariant broken:\n%s", strings.Join(inv.broken, "\n"))
	}
}

// TestRealAgentsStaged runs staged cutovers through the real coordinator
// and the real agent package (fake dataplanes with the invariant checked
// at every call): success in batches, then a failing batch undone, then
// a prepare failure aborted.
func TestRealAgentsStaged(t *testing.T) {
	const n = 5
	inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}}
	l := realAgentsWith(t, n, inv.backend)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "staged1", Strategy: "staged", Batches: []string{"1", "60%", "100%"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	for node, f := range inv.planes {
		if got := f.Dump(); got != "port=4889 fw=[4889]" {
			t.Errorf("%s: %s after a staged cutover", node, got)
		}
	}
	if rep.Strategy != "staged" || len(rep.Batches) != 3 || fmt.Sprint(rep.Batches[1].Nodes) != "[n2 n3]" {
		t.Fatalf("report strategy %q batches %v", rep.Strategy, rep.Batches)
	}
	for i, b := range rep.Batches {
		if b.SwitchedUnixNano == 0 || b.VerifiedUnixNano < b.SwitchedUnixNano || (i > 0 && b.SwitchedUnixNano < rep.Batches[i-1].VerifiedUnixNano) {
			t.Errorf("batch %d: switched %d verified %d (the one before verified %d)", i+1, b.SwitchedUnixNano, b.VerifiedUnixNano, rep.Batches[max(i-1, 0)].VerifiedUnixNano)
		}
	}
	for _, nr := range rep.Nodes {
		if nr.AgentPhase != "PHASE_FINALIZED" || nr.Port != 4889 {
			t.Errorf("node %v", nr)
		}
	}

	// Rolling the finished operation back is a staged operation the
	// other way, then forward again.
	st, err := l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "staged1"})
	if err != nil {
		t.Fatal(err)
	}
	back, msgs, err := drain(st)
	if err != nil || back.State != succeeded || back.Strategy != "staged" || back.RevertsOperationId != "staged1" || back.ToPort != 4789 {
		t.Fatalf("rollback of staged1: %v %v\n%s", back, err, strings.Join(msgs, "\n"))
	}
	for node, f := range inv.planes {
		if got := f.Dump(); got != "port=4789 fw=[4789]" {
			t.Errorf("%s: %s after the staged rollback", node, got)
		}
	}
	if rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "staged1b", Strategy: "staged"}); err != nil || rep.State != succeeded {
		t.Fatalf("staged1b: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}

	// The second batch fails to switch: everyone switches back, then
	// stops listening.
	inv.planes["n3"].SetFailure(dataplane.MethodSwitchSend, errors.New("injected: flow add failed"))
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "staged2", Strategy: "staged", Batches: []string{"1", "60%", "100%"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack || !strings.Contains(rep.Error, "n3") {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if rep.Batches[0].VerifiedUnixNano == 0 || rep.Batches[1].VerifiedUnixNano != 0 || rep.Batches[2].SwitchedUnixNano != 0 {
		t.Errorf("batches after a failure in batch 2: %v", rep.Batches)
	}
	for node, f := range inv.planes {
		if got := f.Dump(); got != "port=4889 fw=[4889]" {
			t.Errorf("%s: %s after the rollback", node, got)
		}
	}

	// A node cannot listen: abort; nobody ever sent the new port.
	before := map[string]int{}
	for node, f := range inv.planes {
		before[node] = len(f.Calls())
	}
	inv.planes["n3"].SetFailure(dataplane.MethodSwitchSend, nil)
	inv.planes["n4"].SetFailure(dataplane.MethodListen, errors.New("injected: iptables failed"))
	rep, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "staged3", Strategy: "staged"})
	if err != nil || rep.State != aborted {
		t.Fatalf("%v %v", rep, err)
	}
	for node, f := range inv.planes {
		if got := f.Dump(); got != "port=4889 fw=[4889]" {
			t.Errorf("%s: %s after the abort", node, got)
		}
		if slices.Contains(f.Calls()[before[node]:], "SwitchSend 4889->4999") {
			t.Errorf("%s switched sending in an aborted operation", node)
		}
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if len(inv.broken) > 0 {
		t.Fatalf("staged invariant broken:\n%s", strings.Join(inv.broken, "\n"))
	}
}

// TestRealAgentsStagedResume crashes the coordinator in each phase of a
// staged operation and starts a new one over the same journal: listening
// is aborted, a switch in progress is undone (unswitch everywhere, then
// rollback), a retirement in progress is finished; the invariant holds
// throughout.
func TestRealAgentsStagedResume(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string // n3 stalls in it
		step   string // the journaled step to crash at
		want   coordinatorv1.OperationState
		dump   string
	}{
		{"listening", dataplane.MethodListen, "prepare", aborted, "port=4789 fw=[4789]"},
		{"switching", dataplane.MethodSwitchSend, "commit", rolledBack, "port=4789 fw=[4789]"},
		{"retiring", dataplane.MethodRetire, "finalize", succeeded, "port=4889 fw=[4889]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}}
			l := realAgentsWith(t, 3, inv.backend)
			inv.planes["n3"].SetLatency(tc.method, 3*time.Second)
			go func() {
				_, _, _ = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "s1", Strategy: "staged", TimeoutMillis: 20000})
			}()
			st := crashAt(t, l, "s1", tc.step) // n3's call is in flight (it stalls 3 s)
			if st.State != tc.want {
				t.Fatalf("after restart: %s (%s), want %s", st.State, st.Error, tc.want)
			}
			for node, f := range inv.planes {
				if got := f.Dump(); got != tc.dump {
					t.Errorf("%s: %s, want %s", node, got, tc.dump)
				}
			}
			inv.mu.Lock()
			defer inv.mu.Unlock()
			if len(inv.broken) > 0 {
				t.Fatalf("staged invariant broken:\n%s", strings.Join(inv.broken, "\n"))
			}
		})
	}
}

// TestRealAgentsStagedSubset runs staged subsets through the real
// coordinator and the real agent package (fake dataplanes, the invariant
// checked at every call): a subset is held with every node listening,
// refuses every other operation and bad continuations without a change,
// survives a coordinator restart, is continued to completion, and is
// undone whole by a rollback or by a failing continuation.
func TestRealAgentsStagedSubset(t *testing.T) {
	const n = 5
	inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}}
	l := realAgentsWith(t, n, inv.backend)
	held := coordinatorv1.OperationState_OPERATION_STATE_HELD
	dumps := func() string {
		var out []string
		for _, node := range []string{"n1", "n2", "n3", "n4", "n5"} {
			out = append(out, node+" "+inv.planes[node].Dump())
		}
		return strings.Join(out, "\n")
	}
	staged := func(rep *coordinatorv1.Report) string {
		var out []string
		for _, nr := range rep.Nodes {
			out = append(out, nr.Node+"="+nr.Staged)
		}
		return strings.Join(out, " ")
	}

	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "sub1", Strategy: "staged", Nodes: []string{"n2", "n1"}})
	if err != nil || rep.State != held {
		t.Fatalf("sub1: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	wantHeld := "n1 port=4789 fw=[4789 4889] rx2=4889 send=4889\nn2 port=4789 fw=[4789 4889] rx2=4889 send=4889\n" +
		"n3 port=4789 fw=[4789 4889] rx2=4889 send=4789\nn4 port=4789 fw=[4789 4889] rx2=4889 send=4789\nn5 port=4789 fw=[4789 4889] rx2=4889 send=4789"
	if got := dumps(); got != wantHeld {
		t.Fatalf("held:\n%s\nwant\n%s", got, wantHeld)
	}
	if got, want := staged(rep), "n1=switched n2=switched n3=listening n4=listening n5=listening"; got != want {
		t.Errorf("report: %s, want %s", got, want)
	}
	if len(rep.Batches) != 2 || fmt.Sprint(rep.Batches[0].Nodes, rep.Batches[1].Nodes) != "[n1] [n2]" {
		t.Errorf("batches %v", rep.Batches)
	}

	// While held: every other operation, and every bad continuation, is
	// refused with the field and the reason, and nothing changes.
	for _, tc := range []struct {
		name string
		req  *coordinatorv1.CutoverRequest
		code codes.Code
		want []string
	}{
		{"atomic", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "atomic"}, codes.FailedPrecondition, []string{"sub1 is held", "an atomic cutover to port 4889", "coordctl rollback sub1"}},
		{"no strategy", &coordinatorv1.CutoverRequest{Port: 4889}, codes.FailedPrecondition, []string{"sub1 is held", "strategy auto (the coordinator's --default-strategy)", "coordctl rollback sub1"}},
		{"another port", &coordinatorv1.CutoverRequest{Port: 4999, Strategy: "staged"}, codes.FailedPrecondition, []string{"sub1 is held", "2 of 5 send 4889 (n1,n2)", "3 still send 4789 (n3,n4,n5)"}},
		{"already switched", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Nodes: []string{"n1"}}, codes.InvalidArgument, []string{"nodes n1", "already send port 4889", "n3,n4,n5"}},
		{"other id", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", OperationId: "sub9"}, codes.InvalidArgument, []string{`operation_id "sub9"`, "continues it"}},
		{"unknown node", &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Nodes: []string{"n9"}}, codes.InvalidArgument, []string{"nodes n9", "not in the inventory"}},
	} {
		_, _, err := l.cutover(tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, status.Convert(err).Message(), w)
			}
		}
	}
	if got := dumps(); got != wantHeld {
		t.Fatalf("after refused requests:\n%s\nwant\n%s", got, wantHeld)
	}

	// A restarted coordinator keeps it held: nothing is undone.
	l.crash()
	l.start()
	l.c.Wait()
	st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: "sub1"})
	if err != nil || st.State != held || staged(st) != "n1=switched n2=switched n3=listening n4=listening n5=listening" {
		t.Fatalf("after a restart: %v %v", st, err)
	}
	if got := dumps(); got != wantHeld {
		t.Fatalf("after a restart:\n%s\nwant\n%s", got, wantHeld)
	}

	// A node that joined the inventory meanwhile never listened: the
	// continuation is refused, nothing changes.
	saved := l.inv
	grown, err := NewInventory("test", append(slices.Clone(saved.Agents), AgentSpec{Node: "n6", Address: "198.18.0.6:9443"}))
	if err != nil {
		t.Fatal(err)
	}
	l.inv = grown
	l.crash()
	l.start()
	l.c.Wait()
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Nodes: []string{"n3"}})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "joined: n6") || !strings.Contains(msg, "left: none") {
		t.Errorf("continuation after n6 joined: %v", err)
	}
	if got := dumps(); got != wantHeld {
		t.Fatalf("after a refused continuation:\n%s\nwant\n%s", got, wantHeld)
	}
	l.inv = saved
	l.crash()
	l.start()
	l.c.Wait()

	// A dry run of the continuation says what it would do, changes nothing.
	dr, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Nodes: []string{"n3"}, DryRun: true})
	if err != nil || dr.State != held || !strings.Contains(strings.Join(msgs, "\n"), "would switch 1 more node(s) to 4889 (n3), and stay held") {
		t.Errorf("dry run of a continuation: %v %v\n%s", dr, err, strings.Join(msgs, "\n"))
	}
	if got := dumps(); got != wantHeld {
		t.Fatalf("after a dry run:\n%s\nwant\n%s", got, wantHeld)
	}

	// Continue with rack=a (n1, n3, n5: n1 already switched, skipped;
	// still held), then the rest (retired).
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Selector: "rack=a"})
	if err != nil || rep.State != held || rep.OperationId != "sub1" {
		t.Fatalf("continue with rack=a: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	if got, want := staged(rep), "n1=switched n2=switched n3=switched n4=listening n5=switched"; got != want {
		t.Errorf("report: %s, want %s", got, want)
	}
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged"})
	if err != nil || rep.State != succeeded || rep.OperationId != "sub1" {
		t.Fatalf("continue with the rest: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.wantAll(t, "port=4889 fw=[4889]", "after the last run")
	if got, want := staged(rep), "n1=retired n2=retired n3=retired n4=retired n5=retired"; got != want {
		t.Errorf("report: %s, want %s", got, want)
	}
	if len(rep.Batches) != 5 || rep.Batches[4].VerifiedUnixNano == 0 || fmt.Sprint(rep.Batches[2].Nodes, rep.Batches[3].Nodes, rep.Batches[4].Nodes) != "[n3] [n5] [n4]" {
		t.Errorf("batches after three runs: %v", rep.Batches)
	}

	// Held, then rolled back: every node back on 4889 alone.
	if rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "sub2", Strategy: "staged", Nodes: []string{"n4"}}); err != nil || rep.State != held {
		t.Fatalf("sub2: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	rb, err := l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "sub2"})
	if err != nil {
		t.Fatal(err)
	}
	if rep, msgs, err = drain(rb); err != nil || rep.State != rolledBack {
		t.Fatalf("rollback of held sub2: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.wantAll(t, "port=4889 fw=[4889]", "after rolling back a held operation")

	// Held, then a continuation whose batch fails: undone whole.
	if rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "sub3", Strategy: "staged", Nodes: []string{"n1", "n2"}}); err != nil || rep.State != held {
		t.Fatalf("sub3: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.planes["n4"].SetFailure(dataplane.MethodSwitchSend, errors.New("injected: flow add failed"))
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, Strategy: "staged", Nodes: []string{"n4"}})
	if err != nil || rep.State != rolledBack || !strings.Contains(rep.Error, "n4") {
		t.Fatalf("failing continuation: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.wantAll(t, "port=4889 fw=[4889]", "after a failing continuation")
	inv.wantIntact(t)
}

// TestRealAgentsStagedSubsetResume: the coordinator crashes while a held
// operation's continuation switches; the restarted one undoes all of it
// (the earlier run's switched node included), senders first, the
// invariant intact throughout.
func TestRealAgentsStagedSubsetResume(t *testing.T) {
	inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}}
	l := realAgentsWith(t, 3, inv.backend)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "h1", Strategy: "staged", Nodes: []string{"n1"}, TimeoutMillis: 20000})
	if err != nil || rep.State != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		t.Fatalf("h1: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.planes["n2"].SetLatency(dataplane.MethodSwitchSend, 3*time.Second)
	go func() {
		_, _, _ = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged"})
	}()
	st := crashAt(t, l, "h1", "commit") // n2's switch is in flight (it stalls 3 s)
	if st.State != rolledBack {
		t.Fatalf("after a crash in the continuation: %s (%s), want ROLLED_BACK", st.State, st.Error)
	}
	inv.wantAll(t, "port=4789 fw=[4789]", "at the end")
	inv.wantIntact(t)
}

// TestInventoryShrinksUnderOperations: a node leaves the inventory (in a
// cluster: its Node is deleted) after one operation finished and while a
// staged one is held. The restarted coordinator starts (it used to refuse
// to, for any journaled operation naming the node), keeps the held one,
// refuses to continue it, and a rollback counts the node unreached
// (FAILED, naming it) without breaking the invariant; with the node back,
// the rollback completes.
func TestInventoryShrinksUnderOperations(t *testing.T) {
	inv := &invariantPlanes{planes: map[string]*dataplane.Fake{}}
	l := realAgentsWith(t, 5, inv.backend)
	if rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 5389, OperationId: "a1"}); err != nil || rep.State != succeeded {
		t.Fatalf("a1: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	if rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 5499, OperationId: "h2", Strategy: "staged", Nodes: []string{"n1"}}); err != nil || rep.State != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		t.Fatalf("h2: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	full := l.inv
	shrunk, err := NewInventory("test", full.Agents[:4])
	if err != nil {
		t.Fatal(err)
	}
	l.inv = shrunk
	l.crash()
	l.start() // fails the test if Resume refuses
	l.c.Wait()
	if st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: "h2"}); err != nil || st.State != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		t.Fatalf("h2 after a restart without n5: %v %v", st, err)
	}
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 5499, Strategy: "staged"})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "left: n5") {
		t.Errorf("continuation without n5: %v", err)
	}
	rb, err := l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "h2"})
	if err != nil {
		t.Fatal(err)
	}
	rep, msgs, err := drain(rb)
	if err != nil || rep.State != coordinatorv1.OperationState_OPERATION_STATE_FAILED || !strings.Contains(rep.Error, "n5") {
		t.Fatalf("rollback of h2 without n5: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "not in the inventory") {
		t.Errorf("the rollback's events do not say n5 is not in the inventory:\n%s", strings.Join(msgs, "\n"))
	}
	l.inv = full
	l.crash()
	l.start()
	l.c.Wait()
	rb, err = l.client.Rollback(context.Background(), &coordinatorv1.RollbackRequest{OperationId: "h2"})
	if err != nil {
		t.Fatal(err)
	}
	if rep, msgs, err = drain(rb); err != nil || rep.State != rolledBack {
		t.Fatalf("rollback of h2 with n5 back: %v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	inv.wantAll(t, "port=5389 fw=[5389]", "at the end")
	inv.wantIntact(t)
}

// crashAt waits until operation id's journal says step, lets the call in
// flight run 300 ms, crashes the coordinator, starts a new one over the
// same journal, waits for it to finish or undo the operation, and returns
// the operation's report.
func crashAt(t *testing.T, l *lab, id, step string) *coordinatorv1.Report {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for journalStep(t, l.dir, id) != step {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %s (journal step %q)", id, step, journalStep(t, l.dir, id))
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	l.crash()
	l.start()
	l.c.Wait()
	st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: id})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// advisedFake is a fake dataplane whose agent says whether the staged
// strategy loses less on it (dataplane.StagedAdvisor), as the real
// backends do for their configuration.
type advisedFake struct {
	*dataplane.Fake
	mu    sync.Mutex
	loses bool
	note  string
}

func (a *advisedFake) StagedLosesLess() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.loses, a.note
}

func (a *advisedFake) advise(loses bool, note string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.loses, a.note = loses, note
}

// TestStrategyAuto: strategy "auto" runs staged when every node's agent
// accepts it and says it loses less there, and atomic when one does not
// (it says it loses more, or refuses staged), naming the node and why in
// the report and the plan; a held operation and the options only one
// strategy takes are refused with the field, the value and the reason.
func TestStrategyAuto(t *testing.T) {
	const n = 4
	planes := map[string]*advisedFake{}
	l := realAgentsWith(t, n, func(node string) dataplane.Backend {
		a := &advisedFake{Fake: dataplane.NewFake("ovs", "vxlan0", fromPort), loses: true, note: "lab: staged lost nothing"}
		planes[node] = a
		return a
	})
	ports := func(want int) {
		t.Helper()
		for node, a := range planes {
			if got := a.Dump(); got != fmt.Sprintf("port=%d fw=[%d]", want, want) {
				t.Errorf("%s: %s, want every node on %d alone", node, got, want)
			}
		}
	}
	run := func(port uint32, id string) *coordinatorv1.Report {
		t.Helper()
		rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: port, OperationId: id, Strategy: StrategyAuto})
		if err != nil {
			t.Fatalf("%s: %v\n%s", id, err, strings.Join(msgs, "\n"))
		}
		if rep.State != succeeded {
			t.Fatalf("%s: %s %s\n%s", id, rep.State, rep.Error, strings.Join(msgs, "\n"))
		}
		return rep
	}

	rep := run(4889, "auto1")
	if rep.Strategy != StrategyStaged || !strings.Contains(rep.StrategyReason, "auto: staged") || !strings.Contains(rep.StrategyReason, "lab: staged lost nothing") {
		t.Fatalf("every node advising staged: strategy %q (%q), want staged with the agents' note", rep.Strategy, rep.StrategyReason)
	}
	ports(4889)

	planes["n3"].advise(false, "OVS without standing redirects")
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4989, Strategy: StrategyAuto})
	if err != nil || p.Strategy != StrategyAtomic || !strings.Contains(p.StrategyReason, "OVS without standing redirects (n3)") {
		t.Fatalf("plan with n3 advising atomic: %v, strategy %q (%q), want atomic naming n3", err, p.GetStrategy(), p.GetStrategyReason())
	}
	rep = run(4989, "auto2")
	if rep.Strategy != StrategyAtomic || !strings.Contains(rep.StrategyReason, "1 of 4 node(s)") || !strings.Contains(rep.StrategyReason, "OVS without standing redirects (n3)") {
		t.Fatalf("n3 advising atomic: strategy %q (%q), want atomic naming n3", rep.Strategy, rep.StrategyReason)
	}
	ports(4989)

	planes["n3"].advise(true, "lab: staged lost nothing")
	planes["n2"].SetStagedRefusal("rp_filter is 1")
	rep = run(5089, "auto3")
	if rep.Strategy != StrategyAtomic || !strings.Contains(rep.StrategyReason, "rp_filter is 1 (n2)") {
		t.Fatalf("n2 refusing staged: strategy %q (%q), want atomic naming n2's refusal", rep.Strategy, rep.StrategyReason)
	}
	ports(5089)

	for _, bad := range []struct {
		req   *coordinatorv1.CutoverRequest
		field string
	}{
		{&coordinatorv1.CutoverRequest{Port: 5189, Strategy: StrategyAuto, Batches: []string{"1", "100%"}}, "batches"},
		{&coordinatorv1.CutoverRequest{Port: 5189, Strategy: StrategyAuto, MaxParallel: 2}, "max_parallel"},
		{&coordinatorv1.CutoverRequest{Port: 5189, Strategy: StrategyAuto, Nodes: []string{"n1"}}, "nodes"},
		{&coordinatorv1.CutoverRequest{Port: 5189, Strategy: StrategyAuto, Selector: "rack=a"}, "selector"},
	} {
		_, _, err := l.cutover(bad.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.field) || !strings.Contains(err.Error(), "strategy auto picks") {
			t.Errorf("auto with %s: %v, want InvalidArgument naming %s and why", bad.field, err, bad.field)
		}
	}
	ports(5089) // nothing changed

	// A held operation: auto is refused beside it (it is not a
	// continuation), naming the held operation.
	planes["n2"].SetStagedRefusal("")
	hold, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 5289, OperationId: "held1", Strategy: StrategyStaged, Nodes: []string{"n1"}})
	if err != nil || hold.State != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		t.Fatalf("staged subset: %v %v\n%s", err, hold.GetState(), strings.Join(msgs, "\n"))
	}
	if _, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 5289, Strategy: StrategyAuto}); err == nil || !strings.Contains(err.Error(), "held1") || !strings.Contains(err.Error(), "strategy auto") {
		t.Fatalf("auto beside a held operation: %v, want refused naming held1", err)
	}
}

// TestDefaultStrategy: a request that names no strategy runs the
// coordinator's --default-strategy: auto (the default) over the whole
// overlay, atomic for a subset, and atomic whatever the agents advise when
// the coordinator is set to atomic. A bad value is refused naming the flag.
func TestDefaultStrategy(t *testing.T) {
	const n = 3
	planes := map[string]*advisedFake{}
	l := realAgentsWith(t, n, func(node string) dataplane.Backend {
		a := &advisedFake{Fake: dataplane.NewFake("ovs", "vxlan0", fromPort), loses: true, note: "lab: staged lost nothing"}
		planes[node] = a
		return a
	})
	run := func(req *coordinatorv1.CutoverRequest) *coordinatorv1.Report {
		t.Helper()
		rep, msgs, err := l.cutover(req)
		if err != nil || rep.State != succeeded {
			t.Fatalf("%s: %v %v\n%s", req.OperationId, err, rep.GetState(), strings.Join(msgs, "\n"))
		}
		return rep
	}
	rep := run(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "def1"})
	if rep.Strategy != StrategyStaged || !strings.Contains(rep.StrategyReason, "auto (the coordinator's --default-strategy): staged") {
		t.Fatalf("no strategy, every node advising staged: %q (%q), want staged by the default", rep.Strategy, rep.StrategyReason)
	}
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4989})
	if err != nil || p.Strategy != StrategyStaged || !strings.Contains(p.StrategyReason, "--default-strategy") {
		t.Fatalf("plan with no strategy: %v, %q (%q), want staged by the default", err, p.GetStrategy(), p.GetStrategyReason())
	}
	// A subset names nodes: auto covers every node, so it runs atomic.
	rep = run(&coordinatorv1.CutoverRequest{Port: 4989, OperationId: "def2", Nodes: []string{"n1", "n2", "n3"}})
	if rep.Strategy != StrategyAtomic || rep.StrategyReason != "" {
		t.Fatalf("no strategy with nodes: %q (%q), want atomic", rep.Strategy, rep.StrategyReason)
	}

	l.crash()
	l.cfg = func(c *Config) { c.DefaultStrategy = StrategyAtomic }
	l.start()
	rep = run(&coordinatorv1.CutoverRequest{Port: 5089, OperationId: "def3"})
	if rep.Strategy != StrategyAtomic || rep.StrategyReason != "" {
		t.Fatalf("--default-strategy atomic: %q (%q), want atomic although every node advises staged", rep.Strategy, rep.StrategyReason)
	}
	for node, a := range planes {
		if got := a.Dump(); got != "port=5089 fw=[5089]" {
			t.Errorf("%s: %s, want 5089 alone", node, got)
		}
	}

	for _, bad := range []string{"staged", "", "Auto"} {
		cfg := Default()
		cfg.DefaultStrategy = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--default-strategy %q", bad)) || !strings.Contains(err.Error(), "want auto or atomic") {
			t.Errorf("--default-strategy %q: %v, want refused naming the flag, the value and the choices", bad, err)
		}
	}
}

// TestDefaultStrategyUnreachableAskedOnce: under the default (auto), an
// agent that does not answer auto's staged preflight is counted
// unreachable by the atomic preflight that follows without being asked
// again: a black-holed node costs the refusal one step's wait, not two.
// An agent that answered is not asked again either: its answer carries
// the atomic judgement.
func TestDefaultStrategyUnreachableAskedOnce(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetFault("Preflight", fakeagent.Fault{Err: unavailable})
	_, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "unr1"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "agent restarting") {
		t.Fatalf("cutover with n2 unreachable: %v, want preflight refused naming it unreachable", err)
	}
	if got := l.fakes["n2"].ReadCalls("Preflight"); got != 1 {
		t.Errorf("n2 was asked Preflight %d times, want once (auto's staged preflight)", got)
	}
	for _, n := range []string{"n1", "n3"} {
		if got := l.fakes[n].ReadCalls("Preflight"); got != 1 {
			t.Errorf("%s was asked Preflight %d times, want once (auto's staged preflight, with the atomic judgement in it)", n, got)
		}
	}
	l.nobodyGot("Prepare")
}

// TestStrategyAutoOnePreflightPerNode: strategy auto asks each agent
// Preflight once, whichever strategy it picks: the plan, the dry run and
// the cutover judge from auto's one round of staged preflights. Picking
// atomic, a node's staged-only problem no longer stops the change and its
// actions are the flip's; an agent older than the atomic judgement
// (PreflightResponse.atomic) is asked again, alone.
func TestStrategyAutoOnePreflightPerNode(t *testing.T) {
	const n = 4
	l := newLab(t, n, nil)
	nodes := slices.Sorted(maps.Keys(l.fakes))
	for _, f := range l.fakes {
		f.SetStagedAdvice(true, "lab: staged lost nothing")
	}
	calls := map[string]int{}
	// once checks that every node was asked Preflight once since the
	// last check, and again those in twice.
	once := func(what string, twice ...string) {
		t.Helper()
		for _, node := range nodes {
			want := 1
			if slices.Contains(twice, node) {
				want = 2
			}
			got := l.fakes[node].ReadCalls("Preflight") - calls[node]
			if got != want {
				t.Errorf("%s: %s was asked Preflight %d times, want %d", what, node, got, want)
			}
			calls[node] += got
		}
	}
	plan := func(strategy string) *coordinatorv1.PlanResponse {
		t.Helper()
		p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Strategy: StrategyAuto})
		if err != nil || p.Strategy != strategy || len(p.Problems) > 0 {
			t.Fatalf("plan: %v, strategy %q (%q), problems %q: want %s and no problem", err, p.GetStrategy(), p.GetStrategyReason(), p.GetProblems(), strategy)
		}
		return p
	}
	dryRun := func(strategy string) {
		t.Helper()
		_, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Strategy: StrategyAuto, DryRun: true})
		if err != nil || !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "auto: "+strategy) }) {
			t.Fatalf("dry run: %v, want auto picking %s\n%s", err, strategy, strings.Join(msgs, "\n"))
		}
	}

	p := plan(StrategyStaged)
	once("plan, auto picking staged")
	if a := p.Nodes[0].Actions; len(a) == 0 || !strings.Contains(a[0], "beside") {
		t.Errorf("plan, auto picking staged: actions %q, want staged's", a)
	}
	dryRun(StrategyStaged)
	once("dry run, auto picking staged")

	l.fakes["n2"].SetStagedRefusal("rp_filter is 1")
	p = plan(StrategyAtomic)
	once("plan, auto picking atomic")
	if !strings.Contains(p.StrategyReason, "rp_filter is 1 (n2)") {
		t.Errorf("plan: reason %q, want n2's refusal of staged", p.StrategyReason)
	}
	for _, np := range p.Nodes {
		if len(np.Actions) == 0 || !strings.Contains(np.Actions[len(np.Actions)-1], "dst_port") {
			t.Errorf("plan, auto picking atomic: %s's actions %q, want the flip's", np.Node, np.Actions)
		}
	}
	dryRun(StrategyAtomic)
	once("dry run, auto picking atomic")

	l.fakes["n4"].SetOldPreflight(true)
	plan(StrategyAtomic)
	once("plan, auto picking atomic, n4 older than the atomic judgement", "n4")

	l.fakes["n4"].SetOldPreflight(false)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "auto-once", Strategy: StrategyAuto})
	if err != nil || rep.State != succeeded || rep.Strategy != StrategyAtomic {
		t.Fatalf("cutover: %v %v %q\n%s", err, rep.GetState(), rep.GetStrategy(), strings.Join(msgs, "\n"))
	}
	once("cutover, auto picking atomic")
}
