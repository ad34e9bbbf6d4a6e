package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pathLab is a lab of n fake agents whose path checks cross one
// simulated underlay.
func pathLab(t *testing.T, n int) (*lab, *fakeagent.Underlay) {
	t.Helper()
	l := newLab(t, n, nil)
	u := &fakeagent.Underlay{}
	for _, f := range l.fakes {
		f.SetUnderlay(u)
	}
	return l, u
}

func between(a, b string) func(from, to string) bool {
	return func(from, to string) bool { return (from == a && to == b) || (from == b && to == a) }
}

const lines = "\n"

func TestPathCheckClean(t *testing.T) {
	l, _ := pathLab(t, 4)
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || len(p.Problems) != 0 {
		t.Fatalf("plan: %v %q", err, p.GetProblems())
	}
	pc := p.PathCheck
	if pc == nil || pc.Port != 4889 || pc.PairsChecked != 12 || pc.BlockedPairs != 0 || pc.Sampling != "every pair" || pc.OverlayMtu != 1450 {
		t.Fatalf("path check = %v", pc)
	}
	if !slices.Equal(pc.Vnis, []uint32{0}) || pc.ReferenceVni == 0 || pc.Sizes[len(pc.Sizes)-1] != 1500 {
		t.Fatalf("vnis %v ref %d sizes %v: want [0], a reference VNI, up to 1500", pc.Vnis, pc.ReferenceVni, pc.Sizes)
	}
	for _, pp := range pc.Pairs {
		if pp.Verdict != "ok" || pp.LargestSize != 1500 {
			t.Errorf("pair %v", pp)
		}
	}
	if got := testutil.ToFloat64(l.c.metrics.PathChecks.WithLabelValues("passed")); got != 1 {
		t.Errorf("path_checks_total{passed} = %v", got)
	}
}

// TestPathCheckRefuses: each underlay fault refuses the cutover with the
// nodes or the size named, and nothing was prepared.
func TestPathCheckRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drop    func(from, to string, vni, size uint32) bool
		verdict map[[2]string]string
		want    []string
	}{
		{"blocked pair", func(from, to string, _, _ uint32) bool { return between("n1", "n3")(from, to) },
			map[[2]string]string{{"n1", "n3"}: "blocked", {"n3", "n1"}: "blocked"},
			[]string{"udp/4889 blocked between 2 node pair(s)", "n1→n3", "n3→n1"}},
		{"one direction", func(from, to string, _, _ uint32) bool { return from == "n2" && to == "n4" },
			map[[2]string]string{{"n2", "n4"}: "blocked"},
			[]string{"blocked between 1 node pair(s)", "n2→n4"}},
		{"vni", func(from, to string, vni, _ uint32) bool { return vni == 0 && between("n1", "n2")(from, to) },
			map[[2]string]string{{"n1", "n2"}: "vni", {"n2", "n1"}: "vni"},
			[]string{"overlay's VNI dropped", "n1→n2 (VNI 0)", "n2→n1 (VNI 0)"}},
		{"mtu", func(_, _ string, _, size uint32) bool { return size > 1400 },
			nil, // every pair
			[]string{"full-size VXLAN frames (1500 bytes, DF) dropped", "n1→n2 (largest passed 1400)", "MTU"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, u := pathLab(t, 4)
			u.SetDrop(tc.drop)
			before := l.dump()
			p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(p.Problems, lines)
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("plan problems do not say %q:\n%s", w, all)
				}
			}
			for _, pp := range p.PathCheck.Pairs {
				want := tc.verdict[[2]string{pp.From, pp.To}]
				if want == "" {
					want = "ok"
					if tc.verdict == nil {
						want = "mtu"
					}
				}
				if pp.Verdict != want {
					t.Errorf("%s→%s: verdict %q, want %q (%s)", pp.From, pp.To, pp.Verdict, want, pp.Detail)
				}
			}
			_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want[0]) {
				t.Fatalf("cutover: %v: want FailedPrecondition saying %q", err, tc.want[0])
			}
			_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op2", DryRun: true})
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("dry run: %v: want FailedPrecondition", err)
			}
			l.nobodyGot("Prepare")
			wantDump(t, l.dump(), before)
			if got := testutil.ToFloat64(l.c.metrics.PathChecks.WithLabelValues("problems")); got != 3 {
				t.Errorf("path_checks_total{problems} = %v, want 3 (plan, cutover, dry run)", got)
			}
		})
	}
}

// TestPathCheckOverride: with allow_path_problems the cutover goes on and
// the problems flag the result.
func TestPathCheckOverride(t *testing.T) {
	l, u := pathLab(t, 3)
	u.SetDrop(func(from, to string, _, _ uint32) bool { return between("n1", "n2")(from, to) })
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1", AllowPathProblems: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || !strings.Contains(strings.Join(rep.Warnings, lines), "n1→n2") || !strings.Contains(strings.Join(rep.Warnings, lines), "accepted: allow_path_problems") {
		t.Fatalf("state %s warnings %q", rep.State, rep.Warnings)
	}
}

// TestPathCheckPortHeld: a node where the port is bound says so, by node
// and port, and the pairs with it are not judged.
func TestPathCheckPortHeld(t *testing.T) {
	l, _ := pathLab(t, 3)
	l.fakes["n2"].HoldPort(4889, "socket inode 42 (0.0.0.0:4889)")
	res, err := l.client.PathCheck(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(res.Problems, lines)
	if !strings.Contains(all, "underlay path check not run on n2: node n2: udp port 4889") || !strings.Contains(all, "address already in use") {
		t.Fatalf("problems %q", res.Problems)
	}
	for _, pp := range res.Pairs {
		involved := pp.From == "n2" || pp.To == "n2"
		if involved != (pp.Verdict == "not_checked") {
			t.Errorf("pair %v", pp)
		}
	}
	if res.PairsChecked != 2 {
		t.Errorf("pairs checked %d, want 2 (n1↔n3)", res.PairsChecked)
	}
}

func TestPathCheckBadInput(t *testing.T) {
	l, _ := pathLab(t, 2)
	for _, req := range []*coordinatorv1.CutoverRequest{{Port: 0}, {Port: 4889, Nodes: []string{"nope"}}, {Port: 30001}} {
		if _, err := l.client.PathCheck(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: err %v, want InvalidArgument", req, err)
		}
	}
}

// TestPathCheckControl: a pair blocked on the new port whose control
// frames pass on the current port is blocked, said so; one that passes
// nothing on either port is inconclusive, not a verdict on the new port.
func TestPathCheckControl(t *testing.T) {
	l, u := pathLab(t, 3)
	u.SetDrop(func(from, to string, _, _ uint32) bool {
		return between("n1", "n3")(from, to) || between("n2", "n3")(from, to)
	})
	u.SetDropControl(between("n2", "n3"))
	res, err := l.client.PathCheck(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if res.ControlPort != fromPort {
		t.Fatalf("control port %d, want %d", res.ControlPort, fromPort)
	}
	want := map[string]string{"n1→n3": "blocked", "n3→n1": "blocked", "n2→n3": "inconclusive", "n3→n2": "inconclusive", "n1→n2": "ok", "n2→n1": "ok"}
	for _, p := range res.Pairs {
		if w := want[p.From+"→"+p.To]; p.Verdict != w {
			t.Errorf("%s→%s: %s (%s), want %s", p.From, p.To, p.Verdict, p.Detail, w)
		}
		if p.Verdict == "blocked" && !strings.Contains(p.Detail, "while the current port udp/4789 passes") {
			t.Errorf("%s→%s: detail %q does not say the control passed", p.From, p.To, p.Detail)
		}
	}
	all := strings.Join(res.Problems, lines)
	for _, w := range []string{"blocked between 2 node pair(s), nothing passed: n1→n3,n3→n1", "cannot conclude for 2 node pair(s)", "n2→n3,n3→n2"} {
		if !strings.Contains(all, w) {
			t.Errorf("problems do not say %q:\n%s", w, all)
		}
	}
}

// TestPathCheckOff: with --path-check=false nothing is checked and the
// result is flagged, never a clean success.
func TestPathCheckOff(t *testing.T) {
	l, u := pathLab(t, 3)
	u.SetDrop(func(from, to string, _, _ uint32) bool { return true })
	l.crash()
	l.cfg = func(c *Config) { c.NoPathCheck = true }
	l.start()
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || !strings.Contains(strings.Join(rep.Warnings, lines), "underlay path check off (--path-check=false)") {
		t.Fatalf("state %s warnings %q", rep.State, rep.Warnings)
	}
}

// TestPathCheckSecondRound: frames lost in the first round only (a loaded
// machine) do not refuse the cutover: the failed directions are checked
// again on their own and pass; a pair blocked in both rounds still
// refuses, and the note says how many were checked again.
func TestPathCheckSecondRound(t *testing.T) {
	l, u := pathLab(t, 4)
	var mu sync.Mutex
	seen := map[string]int{} // PathCheck rounds each of n2's frames to n3 crossed
	u.SetDrop(func(from, to string, vni, size uint32) bool {
		if from != "n2" || to != "n3" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		k := fmt.Sprint(vni, size)
		seen[k]++
		return seen[k] <= 2 // the first round asks both ends about the direction: lost there only
	})
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || len(p.Problems) != 0 {
		t.Fatalf("plan with a first round that lost n2→n3: %v %q", err, p.GetProblems())
	}
	if !slices.ContainsFunc(p.PathCheck.Notes, func(n string) bool {
		return strings.Contains(n, "checked again on their own (2 node(s) in 1 more round(s)): 1 failed direction(s) before, 0 after")
	}) {
		t.Errorf("notes %q", p.PathCheck.Notes)
	}
	u.SetDrop(func(from, to string, _, _ uint32) bool { return from == "n2" && to == "n3" })
	p, err = l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || !slices.ContainsFunc(p.Problems, func(s string) bool { return strings.Contains(s, "n2→n3") }) {
		t.Fatalf("plan with n2→n3 blocked in both rounds: %v %q", err, p.GetProblems())
	}
}

// TestPathCheckSharedWithControl: a problem the
// current port has as well is a warning naming it, not a refusal: the
// check says whether the new port is worse. A new port worse than the
// current one still refuses.
func TestPathCheckSharedWithControl(t *testing.T) {
	for _, tc := range []struct {
		name           string
		drop, ctlDrop  func(from, to string, vni, size uint32) bool
		verdict        string
		warn, problem  string // what the warnings, or the problems, say ("" none)
		detailContains string
	}{
		{"mtu on both ports", func(_, _ string, _, size uint32) bool { return size > 1450 }, func(_, _ string, _, size uint32) bool { return size > 1450 },
			"mtu", "full-size VXLAN frames (1500 bytes, DF) dropped on udp/4889, and the current port udp/4789 drops them too", "", "the current port udp/4789 drops them too (largest passed 1400)"},
		{"mtu, the current port worse", func(_, _ string, _, size uint32) bool { return size > 1450 }, func(_, _ string, _, size uint32) bool { return size > 1350 },
			"mtu", "n1→n2 (largest passed 1400, on the current port 1300)", "", "drops them too"},
		{"mtu, the new port worse", func(_, _ string, _, size uint32) bool { return size > 1350 }, func(_, _ string, _, size uint32) bool { return size > 1450 },
			"mtu", "", "full-size VXLAN frames (1500 bytes, DF) dropped on udp/4889 (MTU black hole)", "largest that passed: 1300"},
		{"vni on both ports", func(_, _ string, vni, _ uint32) bool { return vni == 0 }, func(_, _ string, vni, _ uint32) bool { return vni == 0 },
			"vni", "the current port udp/4789 drops them too", "", "drops them too"},
		{"vni on the new port only", func(_, _ string, vni, _ uint32) bool { return vni == 0 }, nil,
			"vni", "", "overlay's VNI dropped on udp/4889", "a middlebox inspects VXLAN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, u := pathLab(t, 3)
			u.SetDrop(tc.drop)
			u.SetDropControlFrame(tc.ctlDrop)
			before := l.dump()
			p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
			if err != nil {
				t.Fatal(err)
			}
			pc := p.PathCheck
			for _, pp := range pc.Pairs {
				if pp.Verdict != tc.verdict || !strings.Contains(pp.Detail, tc.detailContains) {
					t.Errorf("%s→%s: %s (%s), want %s saying %q", pp.From, pp.To, pp.Verdict, pp.Detail, tc.verdict, tc.detailContains)
				}
			}
			warns, probs := strings.Join(pc.Warnings, lines), strings.Join(p.Problems, lines)
			if tc.problem != "" {
				if !strings.Contains(probs, tc.problem) || len(pc.Warnings) != 0 {
					t.Fatalf("problems %q, warnings %q: want a refusal saying %q", p.Problems, pc.Warnings, tc.problem)
				}
				_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("cutover: %v: want FailedPrecondition", err)
				}
				l.nobodyGot("Prepare")
				wantDump(t, l.dump(), before)
				return
			}
			if len(p.Problems) != 0 || !strings.Contains(warns, tc.warn) {
				t.Fatalf("problems %q, warnings %q: want no problem and a warning saying %q", p.Problems, pc.Warnings, tc.warn)
			}
			rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			if rep.State != succeeded || !strings.Contains(strings.Join(rep.Warnings, lines), tc.warn) {
				t.Fatalf("cutover: state %s, warnings %q: want SUCCEEDED flagged with %q", rep.State, rep.Warnings, tc.warn)
			}
		})
	}
}

// TestPathCheckNodeFirewall: frames that reach a
// node's interfaces (its capture sees them) but not the check's socket
// were dropped by that node's own firewall, which Prepare opens: a note,
// no refusal, no warning, and the underlay is not blamed. A pair the
// underlay blocks is still refused, even where the receiver's firewall
// drops as well.
func TestPathCheckNodeFirewall(t *testing.T) {
	l, u := pathLab(t, 3)
	u.SetHostDrop(func(_, to string) bool { return to == "n2" })
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	pc := p.PathCheck
	if len(p.Problems) != 0 || len(pc.Warnings) != 0 {
		t.Fatalf("problems %q, warnings %q: n2's own firewall is no reason to refuse", p.Problems, pc.Warnings)
	}
	for _, pp := range pc.Pairs {
		want := "ok"
		if pp.To == "n2" {
			want = "node_firewall"
		}
		if pp.Verdict != want {
			t.Errorf("%s→%s: %s (%s), want %s", pp.From, pp.To, pp.Verdict, pp.Detail, want)
		}
	}
	notes := strings.Join(pc.Notes, lines)
	for _, w := range []string{"udp/4889 reaches n2, but n2's own firewall drops it", "n1→n2,n3→n2", "Prepare opens udp/4889"} {
		if !strings.Contains(notes, w) {
			t.Errorf("notes do not say %q:\n%s", w, notes)
		}
	}
	if strings.Contains(notes, "checked again") {
		t.Errorf("a retry round for directions that passed the underlay: notes %q", pc.Notes)
	}
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded || len(rep.Warnings) != 0 {
		t.Fatalf("cutover: %v, state %s, warnings %q: want a clean success", err, rep.GetState(), rep.GetWarnings())
	}

	// The underlay blocks n1↔n3 and n3's own firewall drops too: n1→n3
	// never reached n3, which is the underlay's.
	l2, u2 := pathLab(t, 3)
	u2.SetDrop(func(from, to string, _, _ uint32) bool { return between("n1", "n3")(from, to) })
	u2.SetHostDrop(func(_, to string) bool { return to == "n3" })
	p, err = l2.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(p.Problems, lines); !strings.Contains(all, "udp/4889 blocked between 2 node pair(s), nothing passed: n1→n3,n3→n1") || !strings.Contains(all, "in the underlay") {
		t.Fatalf("problems %q: want n1↔n3 blocked in the underlay", p.Problems)
	}
	if notes := strings.Join(p.PathCheck.Notes, lines); !strings.Contains(notes, "n3's own firewall drops it") || !strings.Contains(notes, "n2→n3") || strings.Contains(notes, "n1→n3") {
		t.Errorf("notes %q: want n3's firewall named for n2→n3 only", p.PathCheck.Notes)
	}
}
