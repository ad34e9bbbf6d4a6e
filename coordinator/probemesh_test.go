package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every target gets its sample with Prepare, addresses from the agents'
// Info, the whole inventory sampled (a subset's peers include nodes
// outside it); every pair answering after the flip: SUCCEEDED, clean.
func TestProbeMeshAllAnswer(t *testing.T) {
	l := newLab(t, 5, nil)
	// n3..n5 are already on 4889, so moving n1,n2 joins them (a subset
	// that leaves one overlay on one port: allowed).
	for _, n := range []string{"n3", "n4", "n5"} {
		l.fakes[n].SetPort(4889)
	}
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1", Nodes: []string{"n1", "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || len(rep.Warnings) > 0 {
		t.Fatalf("state %s (%s) warnings %q\n%s", rep.State, rep.Error, rep.Warnings, strings.Join(msgs, "\n"))
	}
	// 5 nodes, k=3: a symmetric sample of an odd k over an odd count
	// takes k+1, so n1 probes every other node.
	if got := strings.Join(l.fakes["n1"].ProbePeers(), ","); !strings.HasPrefix(got, "n2=198.19.") || strings.Count(got, "=") != 4 || !strings.Contains(got, "n5=") {
		t.Errorf("n1's probe peers: %s", got)
	}
	if got := l.fakes["n5"].ProbePeers(); len(got) != 0 {
		t.Errorf("n5 is not a target but got peers %v", got)
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "probe mesh: 8 sampled pair(s) answered") {
		t.Errorf("no mesh verdict among the events:\n%s", strings.Join(msgs, "\n"))
	}
}

// One node's tunnel carries nothing after the flip: its pairs go dark,
// verify fails and the cutover is ROLLED_BACK naming them.
func TestProbeMeshDarkPairRollsBack(t *testing.T) {
	l := newLab(t, 4, nil)
	l.fakes["n2"].SetProbeDark("n3")
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s (%s), want ROLLED_BACK\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if !strings.Contains(rep.Error, "n2→n3 no answer since the commit") || strings.Contains(rep.Error, "n1→") {
		t.Errorf("error %q: want the dark pair n2→n3 named, and only it", rep.Error)
	}
	wantDump(t, l.dump(), `
		n1 port=4789 op=op1 phase=REVERTED
		n2 port=4789 op=op1 phase=REVERTED
		n3 port=4789 op=op1 phase=REVERTED
		n4 port=4789 op=op1 phase=REVERTED`)
	// Verify polled n2 until its budget ran out; the senders whose pairs
	// had all passed were read once by it, not at every poll (at 10,000
	// nodes rereading them made the reads time out).
	n1, n2 := l.fakes["n1"].ProbeReads(), l.fakes["n2"].ProbeReads()
	if n2 < n1+5 {
		t.Errorf("probe reads: n2 (dark pair) %d, n1 (passed) %d: want n2 read at every poll and n1 not", n2, n1)
	}
}

// A pair that never answered, probed well before the change, is flagged
// as dark before it, not blamed on the cutover: SUCCEEDED with a warning.
func TestProbeMeshBaselineFlagged(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n1"].SetProbeNever("n3")
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "n1→n3 never answered, already before the change") {
		t.Fatalf("state %s (%s) warnings %q, want SUCCEEDED flagged with n1→n3\n%s", rep.State, rep.Error, rep.Warnings, strings.Join(msgs, "\n"))
	}
}

// A target without a probe address is a preflight problem naming it and
// why, and nothing changes; with allow_unprobed it is left out and the
// result flagged. A node outside the targets is left out either way.
func TestProbeMeshUnprobed(t *testing.T) {
	l := newLab(t, 4, nil)
	l.fakes["n3"].SetProbeAddress("", "no overlay address: interface tun0 does not exist")
	_, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "n3: no probe address (probing off: no overlay address: interface tun0 does not exist)") {
		t.Fatalf("err %v: want a preflight refusal naming n3 and its reason", err)
	}
	for n, f := range l.fakes {
		if f.Called("Prepare") {
			t.Errorf("%s got Prepare after a refused preflight", n)
		}
	}
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil || len(p.Problems) != 1 {
		t.Errorf("plan: %v %q", err, p.GetProblems())
	}
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op2", AllowUnprobed: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "n3 (probing off: no overlay address") {
		t.Fatalf("allow_unprobed: state %s warnings %q, want SUCCEEDED flagged naming n3", rep.State, rep.Warnings)
	}
	// A subset without n3, joining n3 where it already is (4789): n3 is
	// only a peer candidate, left out for its lack of an address; clean.
	l.fakes["n3"].SetPort(4789)
	rep, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4789, AllowTunnelPort: true, OperationId: "op3", Nodes: []string{"n1", "n2", "n4"}})
	if err != nil || rep.State != succeeded || len(rep.Warnings) != 0 {
		t.Fatalf("subset without n3: %v %v", rep, err)
	}
	for _, p := range l.fakes["n1"].ProbePeers() {
		if strings.HasPrefix(p, "n3=") {
			t.Errorf("n1 probes n3, which has no probe address")
		}
	}
}

// --probe-verify=false: nothing checks the overlay, every result is
// flagged; the operation-wide verifier still runs.
func TestProbeVerifyOff(t *testing.T) {
	l := newLab(t, 3, nil)
	l.crash()
	l.cfg = func(c *Config) { c.NoProbeVerify = true }
	ran := false
	l.verifier = VerifierFunc(func(context.Context, VerifyInput) error { ran = true; return nil })
	l.start()
	l.fakes["n2"].SetProbeDark("n3")
	rep, _, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "verification is off") || !ran {
		t.Fatalf("state %s warnings %q verifier ran %t", rep.State, rep.Warnings, ran)
	}
}

// The sample stays inside the targets' overlay: a node of another overlay
// is not reachable over the changed tunnel and is never a peer.
func TestProbeMeshStaysInOverlay(t *testing.T) {
	l := newLab(t, 5, nil)
	for i := range l.inv.Agents {
		if a := &l.inv.Agents[i]; a.Node == "n4" || a.Node == "n5" {
			a.Overlay = "blue"
		}
	}
	l.c.Close()
	l.start()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1", Nodes: []string{"n1", "n2", "n3"}})
	if err != nil || rep.State != succeeded || len(rep.Warnings) > 0 {
		t.Fatalf("cutover of the default overlay: %v %v %q\n%s", rep.GetState(), err, rep.GetWarnings(), strings.Join(msgs, "\n"))
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		for _, p := range l.fakes[n].ProbePeers() {
			if strings.HasPrefix(p, "n4=") || strings.HasPrefix(p, "n5=") {
				t.Errorf("%s probes %s, a node of overlay blue", n, p)
			}
		}
		if len(l.fakes[n].ProbePeers()) != 2 {
			t.Errorf("%s probes %v, want its 2 overlay-mates", n, l.fakes[n].ProbePeers())
		}
	}
}

// Verify reads each node back and its probe figures in one call (Info
// with probe_stats): the mesh verifier's first round asks ProbeStats only
// of the agents whose Info did not bring them (an agent older than the
// field, n3 here), and the verdict is the same. A dark pair found in
// those figures is read again at every poll, by ProbeStats.
func TestVerifyMeshWithReadBack(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n3"].SetOldInfo(true)
	// Every pair answered a probe sent well after any flip: the first
	// round passes them all, however soon after the flip it reads (the
	// simulated mesh's own figures trail the clock by a probe interval, and
	// a read within it would take a second round, timing-dependent).
	later := time.Now().Add(time.Hour).UnixNano()
	for _, n := range []string{"n1", "n2", "n3"} {
		var peers []*agentv1.PeerProbeStats
		for _, m := range []string{"n1", "n2", "n3"} {
			if m != n {
				peers = append(peers, &agentv1.PeerProbeStats{Peer: m, Sent: 10, Received: 10, LastAnsweredSentUnixNano: later, LastAnswerUnixNano: later})
			}
		}
		l.fakes[n].SetPeers(peers)
	}
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"})
	if err != nil || rep.State != succeeded {
		t.Fatalf("%v %v\n%s", rep, err, strings.Join(msgs, "\n"))
	}
	n1, n3 := l.fakes["n1"].ProbeStatsCalls(), l.fakes["n3"].ProbeStatsCalls()
	if n3 != n1+1 {
		t.Errorf("ProbeStats calls: n1 %d, n3 (old Info) %d: want one more on n3, whose figures verify had to ask for", n1, n3)
	}
	if r1, r3 := l.fakes["n1"].ProbeReads(), l.fakes["n3"].ProbeReads(); r1 != r3 {
		t.Errorf("figures read: n1 %d, n3 %d: want the same (by Info or by ProbeStats)", r1, r3)
	}

	l2 := newLab(t, 3, nil)
	l2.fakes["n2"].SetProbeDark("n3")
	rep, _, err = l2.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op2"})
	if err != nil || rep.State != rolledBack || !strings.Contains(rep.Error, "n2→n3") {
		t.Fatalf("dark pair: %v %v: want ROLLED_BACK naming n2→n3", rep.GetState(), err)
	}
	if c2, c1 := l2.fakes["n2"].ProbeStatsCalls(), l2.fakes["n1"].ProbeStatsCalls(); c2 < c1+3 {
		t.Errorf("ProbeStats calls: n2 (dark pair) %d, n1 %d: want n2 read again at every poll", c2, c1)
	}
}
