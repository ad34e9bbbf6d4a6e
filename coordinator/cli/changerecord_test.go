package cli

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// sampleRecord is a report of n nodes with everything the change record
// shows: the request, the plan, a per-node timeline, a full probe mesh
// (every ordered pair), events and a warning.
func sampleRecord(n int, state coordinatorv1.OperationState) *coordinatorv1.Report {
	r := &coordinatorv1.Report{
		OperationId: "op-20270115-0001", Kind: "cutover", State: state, FromPort: 4789, ToPort: 4889,
		StartedUnixNano: t0, EndedUnixNano: t0 + 2_400_000_000, CommitUnixNano: t0 + 900_000_000, CommitSpreadNanos: 187_654,
		RequestedBy: `"admin" (role admin, serial 42) from 198.18.0.100:51234`,
		Request:     &coordinatorv1.CutoverRequest{Port: 4889, TimeoutMillis: 30000},
		Plan:        bigPlan(n),
		Phases: []*coordinatorv1.PhaseDuration{
			{Phase: "preflight", Nanos: 300_000_000}, {Phase: "prepare", Nanos: 500_000_000}, {Phase: "commit", Nanos: 150_000_000},
			{Phase: "verify", Nanos: 800_000_000}, {Phase: "confirm", Nanos: 300_000_000}, {Phase: "finalize", Nanos: 350_000_000},
		},
		Warnings: []string{"pair n1 → n2 was dark before the change"},
	}
	r.Plan.Problems = nil
	for _, np := range r.Plan.Nodes {
		np.Problems, np.TargetPortFree = nil, true
	}
	ns := make([]string, n)
	for i := range n {
		ns[i] = r.Plan.Nodes[i].Node
		off := int64(i) * 1_000_000
		nr := &coordinatorv1.NodeResult{Node: ns[i], AgentPhase: "PHASE_FINALIZED", Port: 4889, Backend: "ovs", Device: "vxlan0",
			PreparedUnixNano: t0 + 400_000_000 + off, AppliedUnixNano: t0 + 900_000_000 + int64(i)*1000, ApplyNanos: 1_500_000,
			ConfirmedUnixNano: t0 + 1_800_000_000 + off, FinalizedUnixNano: t0 + 2_200_000_000 + off}
		r.Nodes = append(r.Nodes, nr)
		r.Events = append(r.Events, &coordinatorv1.OperationEvent{OperationId: r.OperationId, Phase: "prepare", Node: ns[i], Message: "prepared", UnixNano: nr.PreparedUnixNano})
	}
	for i, a := range ns {
		for j, b := range ns {
			if i == j {
				continue
			}
			lost := uint64((i + j) % 4)
			r.Disruption = append(r.Disruption, &coordinatorv1.PairDisruption{From: a, To: b, Sent: 240, Lost: lost, LongestGapMicros: int64(lost) * 10_000})
			r.ProbesSent += 240
			r.ProbesLost += lost
		}
	}
	if r.ProbesLost > 0 {
		r.LostByPhase = []*coordinatorv1.PhaseLoss{{Phase: "commit", Lost: r.ProbesLost - 1}, {Phase: "verify", Lost: 1}}
	}
	return r
}

// externalRef finds anything that would make a browser fetch: src/href/
// action to a URL with a scheme or a protocol-relative one, CSS url() or
// @import, a <link>.
var externalRef = regexp.MustCompile(`(?i)(\b(src|href|action|srcset|poster|data)\s*=\s*["']?\s*(https?:|//|ftp:))|url\(|@import|<link\b|<iframe\b|<object\b|<embed\b|<img\b`)

func TestChangeRecordHTMLSelfContained(t *testing.T) {
	// The scan bites: each way a page could fetch is caught.
	for _, bad := range []string{`<script src="https://cdn.example/d3.js">`, `<link rel=stylesheet href="http://x/y.css">`,
		`<a href='//evil/x'>`, `background: url(https://x/p.png)`, `@import "x.css"`, `<img src="data:,">`} {
		if !externalRef.MatchString(bad) {
			t.Errorf("the scan misses %q", bad)
		}
	}

	for _, st := range []coordinatorv1.OperationState{
		coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED, coordinatorv1.OperationState_OPERATION_STATE_RUNNING,
		coordinatorv1.OperationState_OPERATION_STATE_ABORTED, coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK,
		coordinatorv1.OperationState_OPERATION_STATE_FAILED,
	} {
		t.Run(stateName(st), func(t *testing.T) {
			var b bytes.Buffer
			if err := writeRecordHTML(&b, sampleRecord(4, st), time.Unix(0, t0+5e9)); err != nil {
				t.Fatal(err)
			}
			page := b.String()
			if m := externalRef.FindString(page); m != "" {
				t.Errorf("the page references something outside itself: %q", m)
			}
			for _, want := range []string{"<style>", "<script>", `id="timeline"`, `id="heatmap"`, "Content-Security-Policy", "default-src 'none'",
				stateName(st), `"admin" (role admin, serial 42)`, "worker-004.cluster.example", "VXLAN UDP port 4789 → 4889",
				`<span id="lost-in">(sent in: commit 19, verify 1)</span>`} {
				if !strings.Contains(page, want) && !strings.Contains(page, strings.ReplaceAll(want, `"`, "&#34;")) {
					t.Errorf("page lacks %q", want)
				}
			}
			if noFigures := strings.Contains(page, `id="no-probe-figures"`); noFigures {
				t.Errorf("a record with %d pairs says it has no probe figures", len(sampleRecord(4, st).Disruption))
			}
			if partial := strings.Contains(page, "this record is partial"); partial != (st == coordinatorv1.OperationState_OPERATION_STATE_RUNNING) {
				t.Errorf("partial banner shown=%v for %s", partial, stateName(st))
			}
		})
	}
}

// TestChangeRecordEscapes: names, errors and messages come from agents
// and the cluster: in the page they are text, never markup or script.
func TestChangeRecordEscapes(t *testing.T) {
	r := sampleRecord(2, coordinatorv1.OperationState_OPERATION_STATE_FAILED)
	evil := `</script><script>alert(1)</script><img src=x onerror=alert(2)>`
	r.Nodes[0].Node = evil
	r.Nodes[1].Error = evil
	r.Error = evil
	r.Disruption[0].From = evil
	r.Events[0].Message = evil
	var b bytes.Buffer
	if err := writeRecordHTML(&b, r, time.Unix(0, t0)); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") || strings.Count(page, "</script>") != 1 {
		t.Errorf("unescaped input in the page:\n%s", page)
	}
	if !strings.Contains(page, "&lt;/script&gt;&lt;script&gt;alert(1)") {
		t.Errorf("the name is not shown as text")
	}
}

func TestReportCommand(t *testing.T) {
	f := &fakeCoord{report: sampleRecord(3, coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK)}
	addr, _ := serve(t, f, nil)
	code, out, errOut := run(t, "--coordinator", addr, "--insecure", "report", "-o", "html")
	if code != ExitOK || !strings.HasPrefix(out, "<!DOCTYPE html>") || !strings.Contains(out, "ROLLED_BACK") {
		t.Fatalf("report -o html: exit %d, stderr %s, stdout starts %.200q", code, errOut, out)
	}
	code, out, _ = run(t, "--coordinator", addr, "--insecure", "report", "op-1", "-o", "json")
	if code != ExitOK || !strings.Contains(out, `"requested_by"`) || !strings.Contains(out, `"commit_unix_nano"`) || !strings.Contains(out, `"prepared_unix_nano"`) {
		t.Errorf("report -o json: exit %d:\n%.400s", code, out)
	}
	if got := f.lastRequest().(*coordinatorv1.StatusRequest).GetOperationId(); got != "op-1" {
		t.Errorf("asked for %q, want op-1", got)
	}
	code, _, errOut = run(t, "--coordinator", addr, "--insecure", "report", "bad id!")
	if code != ExitUsage || !strings.Contains(errOut, `operation id "bad id!"`) {
		t.Errorf("bad OP: exit %d: %s", code, errOut)
	}
	code, _, errOut = run(t, "--coordinator", addr, "--insecure", "status", "-o", "html")
	if code != ExitUsage || !strings.Contains(errOut, "only coordctl report writes html") {
		t.Errorf("status -o html: exit %d: %s", code, errOut)
	}
}

func TestChangeRecordViewTimes(t *testing.T) {
	v := newRecordView(sampleRecord(2, coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED), time.Unix(0, t0))
	if v.Data.CommitMs != 900 || v.Data.EndMs != 2400 || v.Data.Nodes[1].PreparedMs != 401 || v.Data.Nodes[0].RevertedMs != -1 {
		t.Errorf("chart data %+v", v.Data)
	}
	if got := fmt.Sprint(len(v.Data.Pairs), len(v.Data.Names)); got != "2 2" {
		t.Errorf("pairs, names = %s", got)
	}
	// A running operation's axis ends now.
	r := sampleRecord(2, coordinatorv1.OperationState_OPERATION_STATE_RUNNING)
	r.EndedUnixNano = 0
	if v := newRecordView(r, time.Unix(0, t0+3e9)); v.Data.EndMs != 3000 || !v.Partial {
		t.Errorf("running: end %v partial %v", v.Data.EndMs, v.Partial)
	}
}

// TestChangeRecordStaged: a staged operation's record names the strategy,
// lists its batches and draws a line per batch switch instead of the
// commit instant.
func TestChangeRecordStaged(t *testing.T) {
	r := sampleRecord(3, coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	r.Strategy, r.CommitUnixNano, r.CommitSpreadNanos = "staged", 0, 0
	r.Request.Strategy, r.Request.Batches = "staged", []string{"1", "100%"}
	r.Batches = []*coordinatorv1.StagedBatch{
		{Nodes: []string{r.Nodes[0].Node}, SwitchedUnixNano: t0 + 900_000_000, VerifiedUnixNano: t0 + 1_300_000_000},
		{Nodes: []string{r.Nodes[1].Node, r.Nodes[2].Node}, SwitchedUnixNano: t0 + 1_500_000_000},
	}
	v := newRecordView(r, time.Unix(0, t0+5e9))
	if !v.Staged || len(v.Batches) != 2 || fmt.Sprint(v.Data.Batches) != "[900 1500]" || v.Batches[1].Verified != "-" {
		t.Fatalf("view: staged %t batches %+v chart %v", v.Staged, v.Batches, v.Data.Batches)
	}
	var b bytes.Buffer
	if err := writeRecordHTML(&b, r, time.Unix(0, t0+5e9)); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, w := range []string{`id="batches-table"`, "staged (make-before-break)", "senders switched in 2 batch(es)", "<dt>batches</dt>"} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	if strings.Contains(page, "<dt>Commit instant</dt>") {
		t.Error("a staged record shows a commit instant")
	}
	if externalRef.MatchString(page) {
		t.Error("the staged record fetches something")
	}
}

// Strategy auto: the record shows what was asked and which strategy ran,
// and why.
func TestChangeRecordAuto(t *testing.T) {
	r := sampleRecord(3, coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	r.Request.Strategy = "auto"
	r.Strategy, r.StrategyReason = "atomic", "auto: atomic, staged does not lose less on 1 of 3 node(s): openshift-sdn: the profile refuses the staged strategy (n2)"
	var b bytes.Buffer
	if err := writeRecordHTML(&b, r, time.Unix(0, t0+5e9)); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, w := range []string{"<dt>strategy</dt>", "auto (staged where every node accepts it", "<dt>strategy run</dt>", "atomic (auto: atomic, staged does not lose less on 1 of 3 node(s): openshift-sdn: the profile refuses the staged strategy (n2))"} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}

// A held staged subset: each node's phase says where it sends, and the
// devices, still on the old port, are not flagged.
func TestChangeRecordHeld(t *testing.T) {
	r := sampleRecord(3, coordinatorv1.OperationState_OPERATION_STATE_HELD)
	r.Strategy, r.CommitUnixNano, r.CommitSpreadNanos = "staged", 0, 0
	r.Batches = []*coordinatorv1.StagedBatch{{Nodes: []string{r.Nodes[0].Node}, SwitchedUnixNano: t0 + 900_000_000, VerifiedUnixNano: t0 + 1_300_000_000}}
	for i, n := range r.Nodes {
		n.Port, n.Staged, n.AgentPhase = r.FromPort, "listening", "PHASE_PREPARED"
		if i == 0 {
			n.Staged, n.AgentPhase = "switched", "PHASE_CONFIRMED"
		}
	}
	v := newRecordView(r, time.Unix(0, t0+5e9))
	if v.Nodes[0].Phase != "CONFIRMED · switched" || v.Nodes[1].Phase != "PREPARED · listening" {
		t.Errorf("phases %q %q", v.Nodes[0].Phase, v.Nodes[1].Phase)
	}
	for _, n := range v.Nodes {
		if n.PortClass != "ok" {
			t.Errorf("%s on the old port flagged %s in a held record", n.Node, n.PortClass)
		}
	}
}

// TestChangeRecordPathCheck: the record shows the underlay path check the
// preflight ran: port, control, VNIs, sizes, counts per verdict, problems.
func TestChangeRecordPathCheck(t *testing.T) {
	r := sampleRecord(3, coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	r.Plan.PathCheck = &coordinatorv1.PathCheckResult{Port: 4889, ControlPort: 4789, Vnis: []uint32{0}, Sizes: []uint32{128, 1450},
		Sampling: "every pair", Nodes: 3, PairsChecked: 6, TookMicros: 640_000,
		Problems: []string{"path check, warning allowed: n2→n3 blocked"},
		Pairs:    []*coordinatorv1.PathPair{{From: "n1", To: "n2", Verdict: "ok"}, {From: "n2", To: "n3", Verdict: "blocked"}, {From: "n3", To: "n1", Verdict: "ok"}}}
	var b bytes.Buffer
	if err := writeRecordHTML(&b, r, time.Unix(0, t0+5e9)); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, w := range []string{`id="path-check"`, "udp/4889 (control: the current port 4789)", "VNIs 0; outer sizes 128, 1450 bytes",
		"6 direction(s) between 3 node(s), every pair; took 640.000 ms", "ok: 2, blocked: 1", "n2→n3 blocked"} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}
