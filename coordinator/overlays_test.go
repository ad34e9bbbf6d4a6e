package coordinator

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSubsetRefused is subset safety: a subset of one overlay is refused by
// plan, dry run and cutover, naming who would be cut off from whom, and
// nothing changes (I1, I3, I6).
func TestSubsetRefused(t *testing.T) {
	l := newLab(t, 4, nil)
	const want = "n1,n2 would move to 4889 while n3,n4 stay on 4789: n1,n2 could no longer reach n3,n4 over the overlay"
	for _, req := range []*coordinatorv1.CutoverRequest{{Port: 4889, Nodes: []string{"n1", "n2"}}, {Port: 4889, Selector: "rack=b"}} {
		p, err := l.client.Plan(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if req.Selector == "" && !slices.ContainsFunc(p.Problems, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("plan %v: problems %q lack %q", req, p.Problems, want)
		}
		if req.Selector != "" && !slices.ContainsFunc(p.Problems, func(s string) bool { return strings.Contains(s, "n2,n4 would move to 4889 while n1,n3 stay on 4789") }) {
			t.Errorf("plan %v: problems %q", req, p.Problems)
		}
		for _, dry := range []bool{true, false} {
			req.DryRun = dry
			_, _, err := l.cutover(req)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "could no longer reach") {
				t.Errorf("cutover %v: %v", req, err)
			}
		}
	}
	l.nobodyGot("Prepare")
	if ents, _ := os.ReadDir(filepath.Join(l.dir, "operations")); len(ents) != 0 {
		t.Errorf("journal has %d entries after refused requests", len(ents))
	}
	for n, f := range l.fakes {
		if f.Port() != fromPort {
			t.Errorf("%s on %d", n, f.Port())
		}
	}
}

// TestSubsetOfOwnOverlay: a subset equal to one whole overlay goes, and
// the other overlay is neither touched nor split.
func TestSubsetOfOwnOverlay(t *testing.T) {
	l := newLab(t, 4, nil)
	for i := range l.inv.Agents {
		if a := &l.inv.Agents[i]; a.Node == "n3" || a.Node == "n4" {
			a.Overlay = "blue"
		}
	}
	l.c.Close()
	l.start()
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n1", "n2"}})
	if err != nil || len(p.Problems) != 0 {
		t.Fatalf("plan: %v %v", p.GetProblems(), err)
	}
	// Half of blue is still refused, named by its overlay.
	p, err = l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n3"}})
	if err != nil || !slices.ContainsFunc(p.Problems, func(s string) bool {
		return strings.HasPrefix(s, "overlay blue: n3 would move to 4889 while n4 stays on 4789")
	}) {
		t.Fatalf("plan n3: %q %v", p.GetProblems(), err)
	}
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n1", "n2"}})
	if err != nil || rep.State != succeeded {
		t.Fatalf("cutover: %v %v", rep, err)
	}
	for n, want := range map[string]uint32{"n1": 4889, "n2": 4889, "n3": fromPort, "n4": fromPort} {
		if got := l.fakes[n].Port(); got != want {
			t.Errorf("%s on %d, want %d", n, got, want)
		}
	}
	for _, n := range []string{"n3", "n4"} {
		if l.fakes[n].Called("Prepare") {
			t.Errorf("%s (overlay blue) was prepared", n)
		}
	}
}

// TestSubsetJoinsTheRest: nodes left behind on the old port may be moved
// alone when every other node of the overlay already sends on the target.
func TestSubsetJoinsTheRest(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetPort(4889)
	l.fakes["n3"].SetPort(4889)
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n1"}})
	if err != nil || len(p.Problems) != 0 {
		t.Fatalf("plan: %q %v", p.GetProblems(), err)
	}
	l.fakes["n3"].SetPort(4790)
	p, err = l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889, Nodes: []string{"n1"}})
	if err != nil || !slices.Contains(p.Problems, "n1 would move to 4889 while n3 stays on 4790: n1 could no longer reach n3 over the overlay; target every node of the overlay") {
		t.Fatalf("plan: %q %v", p.GetProblems(), err)
	}
}

// TestInventoryRefresh: with an inventory source, a node added after New
// is in the next plan.
func TestInventoryRefresh(t *testing.T) {
	l := newLab(t, 3, nil)
	full := l.inv
	l.inv = Inventory{Agents: full.Agents[:2]}
	l.c.Close()
	var fail error
	src := func(context.Context) (Inventory, error) { return l.inv, fail }
	l.extra = []Option{WithInventorySource(src)}
	l.start()
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || len(p.Nodes) != 2 {
		t.Fatalf("plan: %v %v", p, err)
	}
	l.inv = full
	p, err = l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || len(p.Nodes) != 3 || len(p.Problems) != 0 {
		t.Fatalf("plan after n3 joined: %v %v", p, err)
	}
	fail = errors.New("apiserver down")
	if _, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot read the inventory, nothing was changed: inventory: apiserver down") {
		t.Fatalf("plan with the source failing: %v", err)
	}
	fail = nil
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || rep.State != succeeded || l.fakes["n3"].Port() != 4889 {
		t.Fatalf("cutover: %v %v", rep, err)
	}
}
