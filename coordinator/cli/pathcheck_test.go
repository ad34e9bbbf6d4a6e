package cli

import (
	"encoding/json"
	"strings"
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func samplePath(blocked bool) *coordinatorv1.PathCheckResult {
	pc := &coordinatorv1.PathCheckResult{Port: 4889, Vnis: []uint32{0}, ReferenceVni: 3079, OverlayMtu: 1450, Sizes: []uint32{256, 1100, 1300, 1400, 1500},
		Sampling: "every pair", Nodes: 2, PairsChecked: 2, TookMicros: 412000,
		Pairs: []*coordinatorv1.PathPair{{From: "n1", To: "n2", Verdict: "ok", LargestSize: 1500}, {From: "n2", To: "n1", Verdict: "ok", LargestSize: 1500}}}
	if blocked {
		pc.Pairs[1].Verdict, pc.Pairs[1].LargestSize, pc.Pairs[1].Detail = "blocked", 0, "no VXLAN frame passed n2→n1 on udp/4889"
		pc.BlockedPairs = 1
		pc.Problems = []string{"underlay path check: udp/4889 blocked between 1 node pair(s), nothing passed: n2→n1"}
	}
	return pc
}

func TestPathCheckCommand(t *testing.T) {
	f := &fakeCoord{path: samplePath(true)}
	addr, _ := serve(t, f, nil)
	base := []string{"--coordinator", addr, "--insecure"}

	code, stdout, stderr := run(t, append(base, "pathcheck", "--port", "4889", "--nodes", "n1,n2")...)
	if code != ExitProblems || !strings.Contains(stdout, "no VXLAN frame passed n2→n1") ||
		!strings.Contains(stdout, "1 of 2 direction(s) pass") || !strings.Contains(stderr, "path check on udp/4889: 1 problem(s); nothing was changed") {
		t.Errorf("blocked: exit %d\n%s\n%s", code, stdout, stderr)
	}
	req, _ := f.lastRequest().(*coordinatorv1.CutoverRequest)
	if req.GetPort() != 4889 || strings.Join(req.GetNodes(), ",") != "n1,n2" {
		t.Errorf("request %v", req)
	}
	f.path = samplePath(false)
	code, stdout, stderr = run(t, append(base, "pathcheck", "--port", "4889", "-o", "json")...)
	var got map[string]any
	if code != ExitOK || json.Unmarshal([]byte(stdout), &got) != nil || got["sampling"] != "every pair" {
		t.Errorf("clean, json: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// Bad input never reaches the coordinator.
	calls := f.Calls()
	if code, _, stderr = run(t, append(base, "pathcheck", "--port", "70000")...); code != ExitUsage || !strings.Contains(stderr, "--port") {
		t.Errorf("bad port: exit %d %s", code, stderr)
	}
	if f.Calls() != calls {
		t.Errorf("bad input reached the coordinator: %s", f.Calls())
	}
}

func TestPlanShowsPathCheck(t *testing.T) {
	p := samplePlan(false)
	p.PathCheck = samplePath(true)
	p.Problems = p.PathCheck.Problems
	f := &fakeCoord{plan: p}
	addr, _ := serve(t, f, nil)
	code, stdout, _ := run(t, "--coordinator", addr, "--insecure", "plan", "--port", "4889", "--allow-path-problems")
	if code != ExitProblems || !strings.Contains(stdout, "path check: udp/4889") || !strings.Contains(stdout, "no VXLAN frame passed n2→n1") ||
		!strings.Contains(stdout, "PATH CHECK") || strings.Count(stdout, "1 blocked") != 2 {
		t.Errorf("plan: exit %d\n%s", code, stdout)
	}
	if req, _ := f.lastRequest().(*coordinatorv1.CutoverRequest); !req.GetAllowPathProblems() {
		t.Errorf("--allow-path-problems not sent: %v", req)
	}
}
