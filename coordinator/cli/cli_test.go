package cli

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

const t0 = int64(1_800_000_000_000_000_000) // a fixed instant, UTC

func sampleReport(state coordinatorv1.OperationState) *coordinatorv1.Report {
	return &coordinatorv1.Report{
		OperationId:     "op-20270115-0001",
		State:           state,
		FromPort:        4789,
		ToPort:          4889,
		StartedUnixNano: t0,
		EndedUnixNano:   t0 + 1_234_567_891,
		Phases: []*coordinatorv1.PhaseDuration{
			{Phase: "preflight", Nanos: 45_123_456},
			{Phase: "prepare", Nanos: 310_000_001},
			{Phase: "commit", Nanos: 31_250_000},
			{Phase: "verify", Nanos: 800_000_000},
			{Phase: "finalize", Nanos: 48_194_434},
		},
		CommitSpreadNanos: 187_654, CommitMarginNanos: 41_250_000,
		Nodes: []*coordinatorv1.NodeResult{
			{Node: "n1", AgentPhase: "PHASE_FINALIZED", Port: 4889, ApplyNanos: 1_523_000, ClockOffsetNanos: -12_345},
			{Node: "n2", AgentPhase: "PHASE_FINALIZED", Port: 4889, ApplyNanos: 1_611_222, ClockOffsetNanos: 250_001, ProbeStallMicros: 45_200},
			{Node: "node-three.example", AgentPhase: "PHASE_FINALIZED", Port: 4889, ApplyNanos: 1_499_999, ClockOffsetNanos: 0, ProbeStallMicros: 9_999},
		},
		Disruption: []*coordinatorv1.PairDisruption{
			// Delayed in the prepare, lost at the commit and after it.
			{From: "n1", To: "n2", Sent: 1200, Lost: 3, LongestGapMicros: 2_150, LongestGapPhase: "prepare",
				LostByPhase: []*coordinatorv1.PhaseLoss{{Phase: "commit", Lost: 2}, {Phase: "verify", Lost: 1}}},
			{From: "n2", To: "n1", Sent: 1200, Lost: 0, LongestGapMicros: 1_000},
		},
		ProbesSent:       2400,
		ProbesLost:       3,
		LongestGapMicros: 2_150,
		LostByPhase:      []*coordinatorv1.PhaseLoss{{Phase: "commit", Lost: 2}, {Phase: "verify", Lost: 1}},
	}
}

func sampleEvents(state coordinatorv1.OperationState) []*coordinatorv1.OperationEvent {
	ev := func(i int, phase, node, msg string, failed bool) *coordinatorv1.OperationEvent {
		return &coordinatorv1.OperationEvent{OperationId: "op-20270115-0001", Phase: phase, Node: node, Message: msg, Failed: failed, UnixNano: t0 + int64(i)*10_000_000}
	}
	evs := []*coordinatorv1.OperationEvent{
		ev(0, "preflight", "", "3 agents ready, all on 4789", false),
		ev(1, "prepare", "n1", "port 4889 open", false),
		ev(2, "prepare", "n2", "port 4889 open", false),
		ev(3, "commit", "n1", "applied in 1.523 ms", false),
		ev(4, "verify", "n2", "probe to n1 lost", state != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED),
	}
	last := ev(5, "finalize", "", "done", false)
	last.Report = sampleReport(state)
	return append(evs, last)
}

func sampleAgents() []*coordinatorv1.Agent {
	return []*coordinatorv1.Agent{
		{Node: "n1", Address: "198.18.0.1:9443", Version: "v0.1.0", Backend: "ovs", Device: "vxlan0", CurrentPort: 4789, Ready: true, ClockOffsetNanos: -12_345, RttNanos: 301_000},
		{Node: "n2", Address: "198.18.0.2:9443", Version: "v0.1.0", Backend: "kernel-vxlan", Device: "flannel.1", CurrentPort: 4789, NotReady: []string{"ovs", "probe"}, ClockOffsetNanos: 250_001, RttNanos: 290_500},
		{Node: "n3", Address: "198.18.0.3:9443", Error: "connection refused"},
	}
}

func samplePlan(problems bool) *coordinatorv1.PlanResponse {
	p := &coordinatorv1.PlanResponse{
		CurrentPort: 4789, TargetPort: 4889,
		Nodes: []*coordinatorv1.NodePlan{
			{Node: "n1", CurrentPort: 4789, TargetPortFree: true, Actions: []string{"open 4889/udp", "set vxlan0 dst_port=4889"}},
			{Node: "n2", CurrentPort: 4789, TargetPortFree: true, Actions: []string{"open 4889/udp", "set vxlan0 dst_port=4889"}},
		},
	}
	if problems {
		p.Nodes[1].TargetPortFree = false
		p.Nodes[1].Problems = []string{"udp 4889 bound by pid 4242 (dnsmasq)"}
		p.Problems = []string{"n2: udp 4889 bound by pid 4242 (dnsmasq)"}
	}
	return p
}

// TestRenderGolden compares the text output with testdata/render.golden
// (go test -run TestRenderGolden -update rewrites it).
func TestRenderGolden(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("== agents\n")
	renderAgents(&b, sampleAgents())
	b.WriteString("== plan (problems)\n")
	renderPlan(&b, samplePlan(true), false)
	b.WriteString("== plan (clean, a CNI hook)\n")
	clean := samplePlan(false)
	clean.HookSteps = []string{"cluster: flannel ConfigMap kube-flannel/kube-flannel-cfg has Backend.Port 4789 which matches the current port",
		"cluster: once the operation succeeded, the admin: restart flanneld one node at a time so that it reads Backend.Port 4889 (it keeps the port it read at start, and a flannel.1 it recreates would get that one):\nkubectl -n kube-flannel rollout restart daemonset/kube-flannel-ds && kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds"}
	renderPlan(&b, clean, false)
	b.WriteString("== events\n")
	p := newProgress(&b, false)
	for _, e := range sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK) {
		p.event(e)
	}
	b.WriteString("== report (next steps)\n")
	ok := sampleReport(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	ok.NextSteps = []string{"cluster: restart flanneld one node at a time so that it reads Backend.Port 4889 (it keeps the port it read at start, and a flannel.1 it recreates would get that one):\nkubectl -n kube-flannel rollout restart daemonset/kube-flannel-ds && kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds"}
	renderReport(&b, ok)
	b.WriteString("== report (failed, no probes)\n")
	r := sampleReport(coordinatorv1.OperationState_OPERATION_STATE_FAILED)
	r.Error = "n2: rollback: ovs-vsctl: timeout"
	r.Disruption, r.ProbesSent, r.ProbesLost, r.LongestGapMicros = nil, 0, 0, 0
	r.Nodes[1].Error = "rollback: ovs-vsctl: timeout"
	r.Nodes[1].AgentPhase = "PHASE_FAILED"
	renderReport(&b, r)
	b.WriteString("== report (staged subset, held)\n")
	r = sampleReport(coordinatorv1.OperationState_OPERATION_STATE_HELD)
	r.Strategy, r.Disruption, r.ProbesSent, r.ProbesLost, r.LongestGapMicros = "staged", nil, 0, 0, 0
	r.Batches = []*coordinatorv1.StagedBatch{{Nodes: []string{r.Nodes[0].Node}}}
	for i, nr := range r.Nodes {
		nr.Staged, nr.AgentPhase = "listening", "PHASE_PREPARED"
		if i == 0 {
			nr.Staged, nr.AgentPhase = "switched", "PHASE_CONFIRMED"
		}
	}
	renderReport(&b, r)

	golden := filepath.Join("testdata", "render.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("rendering differs from %s (rerun with -update if intended):\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}

// TestBadInputNoRPC: every bad input exits 2 with an error naming the flag
// and the value, and coordctl never even connects.
func TestBadInputNoRPC(t *testing.T) {
	f := &fakeCoord{}
	addr, ln := serve(t, f, nil)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"cutover", "--port", "48x9"}, []string{`--port "48x9"`, "not a whole number", "1-65535"}},
		{[]string{"cutover", "--port", "0"}, []string{`--port "0"`, "outside 1-65535"}},
		{[]string{"cutover", "--port", "65536"}, []string{`--port "65536"`, "outside 1-65535"}},
		{[]string{"cutover", "--port=-1"}, []string{`--port "-1"`, "outside 1-65535"}},
		{[]string{"cutover", "--port", ""}, []string{"--port is required"}},
		{[]string{"plan"}, []string{"--port is required"}},
		{[]string{"plan", "--port", "4889", "--nodes", "n1", "--selector", "role=edge"}, []string{`--nodes "n1" and --selector "role=edge"`, "not both"}},
		{[]string{"plan", "--port", "4889", "--selector", "role"}, []string{`--selector "role"`, "no '='"}},
		{[]string{"plan", "--port", "4889", "--selector", "Bad_Prefix.com/x=y"}, []string{`--selector "Bad_Prefix.com/x=y"`, "invalid prefix"}},
		{[]string{"plan", "--port", "4889", "--selector", "a=-x"}, []string{`label value "-x" is invalid`}},
		{[]string{"plan", "--port", "4889", "--selector", "a=b,a=c"}, []string{`label key "a" given twice`}},
		{[]string{"cutover", "--port", "4889", "--strategy", "slow"}, []string{`--strategy "slow"`, "atomic", "staged", "auto"}},
		{[]string{"cutover", "--port", "4889", "--strategy", "auto", "--batches", "1,100%"}, []string{`--batches "1,100%"`, "only --strategy staged"}},
		{[]string{"cutover", "--port", "4889", "--batches", "1,100%"}, []string{`--batches "1,100%"`, "only --strategy staged"}},
		{[]string{"cutover", "--port", "4889", "--strategy", "staged", "--batches", "1,,100%"}, []string{`--batches "1,,100%"`, "batch 2 is empty"}},
		{[]string{"cutover", "--port", "4889", "--max-parallel", "2"}, []string{"--max-parallel 2", "only --strategy staged"}},
		{[]string{"cutover", "--port", "4889", "--strategy", "staged", "--max-parallel", "-1"}, []string{"--max-parallel -1", "want 1 or more"}},
		{[]string{"plan", "--port", "4889", "--selector", "a!=b"}, []string{`--selector "a!=b"`, "only k=v equality"}},
		{[]string{"plan", "--port", "4889", "--selector", "=b"}, []string{`label key "" is empty`}},
		{[]string{"cutover", "--port", "4889", "--nodes", "n1,,n2"}, []string{`--nodes "n1,,n2"`, "node name 2 of 3 is empty"}},
		{[]string{"cutover", "--port", "4889", "--nodes", "n1,n1"}, []string{`"n1" given twice`}},
		{[]string{"cutover", "--port", "4889", "--nodes", "Node_1"}, []string{`"Node_1" is not a node name`}},
		{[]string{"cutover", "--port", "4889", "--timeout", "0s"}, []string{"--timeout 0s", "must be positive"}},
		{[]string{"cutover", "--port", "4889", "--timeout", "-5s"}, []string{"--timeout -5s", "must be positive"}},
		{[]string{"cutover", "--port", "4889", "--timeout", "3000h"}, []string{"--timeout 3000h0m0s", "longer than 1h0m0s"}},
		{[]string{"cutover", "--port", "4889", "--timeout", "soon"}, []string{`invalid argument "soon" for "--timeout"`}},
		{[]string{"agents", "-o", "yaml"}, []string{`-o/--output "yaml"`, "text, json"}},
		{[]string{"status", "op 1"}, []string{`operation id "op 1"`}},
		{[]string{"status", "a", "b"}, []string{"accepts at most 1 arg"}},
		{[]string{"cutover", "--port", "4889", "extra"}, []string{`unknown command "extra"`}},
		{[]string{"cutover", "--port", "4889", "--frob"}, []string{"unknown flag: --frob"}},
		{[]string{"agents", "--coordinator", "nohost"}, []string{`--coordinator "nohost"`, "not host:port"}},
		{[]string{"agents", "--coordinator", "127.0.0.1:99999"}, []string{`--coordinator "127.0.0.1:99999"`, "1-65535"}},
		{[]string{"agents", "--insecure=false", "--tls-ca", "/nonexistent/ca.pem"}, []string{`--tls-ca "/nonexistent/ca.pem": cannot read`, "--tls-cert: no file given"}},
		{[]string{"agents", "--insecure", "--tls-dir", "/tmp"}, []string{"--insecure together with --tls-dir"}},
		{[]string{"agents", "--insecure=false"}, []string{"no TLS identity", "--tls-dir"}},
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{[]string{"certs", "--agent", "n1=198.18.0.1"}, []string{"--dir is required"}},
		{[]string{"certs", "--dir", t.TempDir(), "--agent", "n1=300.1.1.1"}, []string{`--agent "n1=300.1.1.1"`, `"300.1.1.1" is not a usable IP`}},
		{[]string{"certs", "--dir", t.TempDir(), "--agent", "=198.18.0.1"}, []string{"has no name"}},
		{[]string{"certs", "--dir", t.TempDir()}, []string{"--agent: none given"}},
		{[]string{"certs", "--dir", t.TempDir(), "--agent", "n1", "--validity", "0s"}, []string{"--validity 0s"}},
		{[]string{"certs", "--dir", t.TempDir(), "--agent", "n1", "--coordinator-ip", "x"}, []string{`--coordinator-ip "x"`}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--coordinator", addr, "--insecure"}, tc.args...)
			// The later --coordinator/--insecure in tc.args win (pflag: last one).
			code, stdout, stderr := run(t, args...)
			if code != ExitUsage {
				t.Errorf("exit code %d, want %d; stderr: %s", code, ExitUsage, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stdout+stderr, "goroutine ") || strings.Contains(stderr, "rpc error:") {
				t.Errorf("raw Go/gRPC dump in output:\n%s%s", stdout, stderr)
			}
		})
	}
	if c := f.Calls(); c != "" {
		t.Errorf("RPCs made on bad input: %s", c)
	}
	if n := ln.accepts.Load(); n != 0 {
		t.Errorf("%d connections opened on bad input", n)
	}
}

func TestCutoverStreamExitCodes(t *testing.T) {
	S := coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED
	for _, tc := range []struct {
		name   string
		state  coordinatorv1.OperationState
		dryRun bool
		want   int
		msg    string
	}{
		{"succeeded", S, false, ExitOK, ""},
		{"rolled back", coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK, false, ExitFailed, "ROLLED_BACK: every node is back on port 4789"},
		{"aborted", coordinatorv1.OperationState_OPERATION_STATE_ABORTED, false, ExitFailed, "ABORTED"},
		{"failed", coordinatorv1.OperationState_OPERATION_STATE_FAILED, false, ExitOpFailed, "FAILED: the cluster may be split"},
		{"still running", coordinatorv1.OperationState_OPERATION_STATE_RUNNING, false, ExitInterrupted, "coordctl status"},
		{"dry run ok", S, true, ExitOK, ""},
		{"dry run problems", coordinatorv1.OperationState_OPERATION_STATE_ABORTED, true, ExitProblems, "nothing was changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCoord{events: sampleEvents(tc.state)}
			addr, _ := serve(t, f, nil)
			args := []string{"--coordinator", addr, "--insecure", "cutover", "--port", "4889", "--selector", "node-role.kubernetes.io/worker=", "--timeout", "7s", "--allow-tunnel-port"}
			if tc.dryRun {
				args = append(args, "--dry-run")
			}
			code, stdout, stderr := run(t, args...)
			if code != tc.want {
				t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.want, stdout, stderr)
			}
			if tc.msg != "" && !strings.Contains(stderr, tc.msg) {
				t.Errorf("stderr does not say %q:\n%s", tc.msg, stderr)
			}
			if !strings.Contains(stderr, "WARNING: --insecure") {
				t.Errorf("no --insecure warning on stderr:\n%s", stderr)
			}
			// Plain mode: one line per event, then the report.
			for _, w := range []string{
				"08:00:00.010 prepare   n1           ok     port 4889 open",
				"08:00:00.000 preflight -            ok     3 agents ready, all on 4789",
				"operation op-20270115-0001: " + stateName(tc.state) + ", port 4789 -> 4889",
				"commit spread: 0.188 ms",
			} {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			if strings.Contains(stdout, "\x1b[") {
				t.Error("escape sequences in non-TTY output")
			}
			want := &coordinatorv1.CutoverRequest{Port: 4889, Selector: "node-role.kubernetes.io/worker=", TimeoutMillis: 7000, AllowTunnelPort: true, DryRun: tc.dryRun}
			if got := f.lastRequest(); !proto.Equal(got, want) {
				t.Errorf("request %v, want %v", got, want)
			}
		})
	}
}

func TestCutoverJSONParsesBack(t *testing.T) {
	f := &fakeCoord{events: sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)}
	addr, _ := serve(t, f, nil)
	code, stdout, stderr := run(t, "--coordinator", addr, "--insecure", "cutover", "--port", "4889", "--nodes", "n1,n2", "-o", "json")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got coordinatorv1.Report
	if err := protojson.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("stdout is not one JSON Report: %v\n%s", err, stdout)
	}
	if want := sampleReport(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED); !proto.Equal(&got, want) {
		t.Errorf("report round trip differs:\n%v\n%v", &got, want)
	}
	if r := f.lastRequest().(*coordinatorv1.CutoverRequest); strings.Join(r.GetNodes(), ",") != "n1,n2" || r.GetTimeoutMillis() != 0 {
		t.Errorf("request %v: want nodes n1,n2 and no timeout (coordinator default)", r)
	}
}

func TestServerErrorsPrintedClearly(t *testing.T) {
	for _, tc := range []struct {
		err  error
		args []string
		want int
		msg  string
	}{
		{status.Error(codes.InvalidArgument, "port 30080: inside the NodePort range 30000-32767; pass --allow-nodeport-range if intended"),
			[]string{"cutover", "--port", "30080"}, ExitUsage, "cutover: the coordinator refused the request (InvalidArgument): port 30080: inside the NodePort range"},
		{status.Error(codes.FailedPrecondition, "operation op-7 is running"),
			[]string{"cutover", "--port", "4889"}, ExitProblems, "(FailedPrecondition): operation op-7 is running"},
		{status.Error(codes.NotFound, "no operation op-9"),
			[]string{"status", "op-9"}, ExitUsage, "status: the coordinator refused the request (NotFound): no operation op-9"},
		{status.Error(codes.Internal, "journal: disk full"),
			[]string{"agents"}, ExitFailed, "agents: Internal: journal: disk full"},
		{status.Error(codes.FailedPrecondition, "nothing to roll back"),
			[]string{"rollback"}, ExitProblems, "rollback: the coordinator refused the request (FailedPrecondition): nothing to roll back"},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			f := &fakeCoord{err: tc.err}
			addr, _ := serve(t, f, nil)
			code, _, stderr := run(t, append([]string{"--coordinator", addr, "--insecure"}, tc.args...)...)
			if code != tc.want {
				t.Errorf("exit %d, want %d: %s", code, tc.want, stderr)
			}
			if !strings.Contains(stderr, tc.msg) || strings.Contains(stderr, "rpc error:") {
				t.Errorf("stderr %q, want %q and no raw rpc error", stderr, tc.msg)
			}
		})
	}
}

func TestStreamWithoutReport(t *testing.T) {
	evs := sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	f := &fakeCoord{events: evs[:3]}
	addr, _ := serve(t, f, nil)
	code, stdout, stderr := run(t, "--coordinator", addr, "--insecure", "cutover", "--port", "4889")
	if code != ExitInterrupted || !strings.Contains(stderr, "without a final report") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	if strings.Count(stdout, "\n") != 3 {
		t.Errorf("want 3 event lines:\n%s", stdout)
	}
}

func TestPlanAgentsStatusRollback(t *testing.T) {
	f := &fakeCoord{agents: sampleAgents(), plan: samplePlan(true), report: sampleReport(coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK),
		events: sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK)}
	addr, _ := serve(t, f, nil)
	base := []string{"--coordinator", addr, "--insecure"}

	code, stdout, stderr := run(t, append(base, "plan", "--port", "4889")...)
	if code != ExitProblems || !strings.Contains(stdout, "1 problem(s):") || !strings.Contains(stderr, "plan for port 4889: 1 problem(s); nothing was changed") {
		t.Errorf("plan with problems: exit %d\n%s\n%s", code, stdout, stderr)
	}
	f.plan = samplePlan(false)
	if code, stdout, stderr = run(t, append(base, "plan", "--port", "4889", "-o", "json")...); code != ExitOK {
		t.Errorf("clean plan: exit %d: %s", code, stderr)
	}
	var p coordinatorv1.PlanResponse
	if err := protojson.Unmarshal([]byte(stdout), &p); err != nil || !proto.Equal(&p, samplePlan(false)) {
		t.Errorf("plan JSON: %v\n%s", err, stdout)
	}

	code, stdout, _ = run(t, append(base, "agents")...)
	if code != ExitOK || !strings.Contains(stdout, "no: ovs, probe") || !strings.Contains(stdout, "unreachable: connection refused") || !strings.Contains(stdout, "-0.012") {
		t.Errorf("agents: exit %d\n%s", code, stdout)
	}

	// status exits by the operation's state; an explicit id is passed on.
	code, stdout, _ = run(t, append(base, "status", "op-20270115-0001")...)
	if code != ExitFailed || !strings.Contains(stdout, "ROLLED_BACK") {
		t.Errorf("status rolled back: exit %d\n%s", code, stdout)
	}
	if r := f.lastRequest().(*coordinatorv1.StatusRequest); r.GetOperationId() != "op-20270115-0001" {
		t.Errorf("status request %v", r)
	}
	f.report = sampleReport(coordinatorv1.OperationState_OPERATION_STATE_RUNNING)
	if code, _, _ = run(t, append(base, "status")...); code != ExitOK {
		t.Errorf("status running: exit %d", code)
	}

	// rollback succeeds when the operation ends ROLLED_BACK.
	if code, _, stderr = run(t, append(base, "rollback")...); code != ExitOK {
		t.Errorf("rollback: exit %d: %s", code, stderr)
	}
	f.events = sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	if code, _, stderr = run(t, append(base, "rollback", "op-1")...); code != ExitFailed || !strings.Contains(stderr, "nothing was rolled back") {
		t.Errorf("rollback of a succeeded op: exit %d: %s", code, stderr)
	}
	if got := f.Calls(); got != "Plan,Plan,ListAgents,Status,Status,Rollback,Rollback" {
		t.Errorf("calls %s", got)
	}
}

func TestUnreachable(t *testing.T) {
	ln, addr := closedPort(t)
	_ = ln
	start := time.Now()
	code, _, stderr := run(t, "--coordinator", addr, "--insecure", "agents")
	if code != ExitUnreachable || !strings.Contains(stderr, "coordinator "+addr+" unreachable (Unavailable)") {
		t.Errorf("exit %d: %s", code, stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s to report an unreachable coordinator", d)
	}
}

func TestHelpAndVersion(t *testing.T) {
	code, stdout, _ := run(t, "help", "exit-codes")
	for _, c := range []string{"0  success", "2  bad input", "3  coordinator unreachable", "4  plan/preflight", "5  the operation ended FAILED", "6  the stream ended", "7  the operation SUCCEEDED with warnings"} {
		if code != 0 || !strings.Contains(stdout, c) {
			t.Errorf("help exit-codes lacks %q (exit %d)", c, code)
		}
	}
	if code, stdout, _ = run(t, "cutover", "--help"); code != 0 || !strings.Contains(stdout, "Exit codes: 0 SUCCEEDED") {
		t.Errorf("cutover --help: exit %d\n%s", code, stdout)
	}
	if code, stdout, _ = run(t, "version"); code != 0 || !strings.HasPrefix(stdout, "coordctl ") {
		t.Errorf("version: %d %q", code, stdout)
	}
}

// TestCutoverStaged: --strategy staged and --batches reach the
// coordinator as given, and a staged report shows its batches instead of a
// commit spread.
func TestCutoverStaged(t *testing.T) {
	evs := sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	rep := evs[len(evs)-1].GetReport()
	rep.Strategy = "staged"
	rep.Batches = []*coordinatorv1.StagedBatch{
		{Nodes: []string{"n1"}, SwitchedUnixNano: rep.StartedUnixNano + 40e6, VerifiedUnixNano: rep.StartedUnixNano + 90e6},
		{Nodes: []string{"n2", "n3"}, SwitchedUnixNano: rep.StartedUnixNano + 130e6, VerifiedUnixNano: rep.StartedUnixNano + 180e6},
	}
	f := &fakeCoord{events: evs}
	addr, _ := serve(t, f, nil)
	code, stdout, stderr := run(t, "--coordinator", addr, "--insecure", "cutover", "--port", "4889", "--strategy", "staged", "--batches", "1, 100%")
	if code != ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	want := &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "staged", Batches: []string{"1", "100%"}}
	if got := f.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("request %v, want %v", got, want)
	}
	for _, w := range []string{"strategy: staged, 2 batch(es)", "1      n1", "2      n2,n3  130.000        180.000"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("stdout lacks %q:\n%s", w, stdout)
		}
	}
	if strings.Contains(stdout, "commit spread") {
		t.Errorf("a staged report shows a commit spread:\n%s", stdout)
	}
}

// TestCutoverAuto: --strategy auto reaches the coordinator as given, and
// the report says which strategy ran and why.
func TestCutoverAuto(t *testing.T) {
	evs := sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	rep := evs[len(evs)-1].GetReport()
	rep.Strategy, rep.StrategyReason = "atomic", "auto: atomic, staged does not lose less on 1 of 3 node(s): openshift-sdn: the profile refuses the staged strategy (n2)"
	f := &fakeCoord{events: evs}
	addr, _ := serve(t, f, nil)
	code, stdout, stderr := run(t, "--coordinator", addr, "--insecure", "cutover", "--port", "4889", "--strategy", "auto")
	if code != ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	want := &coordinatorv1.CutoverRequest{Port: 4889, Strategy: "auto"}
	if got := f.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("request %v, want %v", got, want)
	}
	if w := "strategy: atomic (auto: atomic, staged does not lose less on 1 of 3 node(s): openshift-sdn: the profile refuses the staged strategy (n2))"; !strings.Contains(stdout, w) {
		t.Errorf("stdout lacks %q:\n%s", w, stdout)
	}
}

// TestLargeReport: the report of a 10,000-node operation is one message
// larger than gRPC's default 4 MiB; coordctl receives it whole.
func TestLargeReport(t *testing.T) {
	evs := sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)
	rep := evs[len(evs)-1].GetReport()
	for i := range 12000 {
		rep.Nodes = append(rep.Nodes, &coordinatorv1.NodeResult{Node: fmt.Sprintf("node-%05d.rack-%02d.example", i, i%40), AgentPhase: "PHASE_FINALIZED", Port: 4889,
			Error: strings.Repeat("x", 300)})
	}
	if size := proto.Size(evs[len(evs)-1]); size <= 4<<20 {
		t.Fatalf("test report is %d bytes: not over the 4 MiB default", size)
	}
	f := &fakeCoord{events: evs}
	addr, _ := serve(t, f, nil)
	code, stdout, stderr := run(t, "--coordinator", addr, "--insecure", "cutover", "--port", "4889", "-o", "json")
	if code != ExitOK || !strings.Contains(stdout, "node-11999.rack-39.example") {
		t.Fatalf("exit %d, stderr %s, stdout %d bytes", code, stderr, len(stdout))
	}
}

// TestCutoverStrategyUnset: without --strategy the request names none (the
// coordinator's --default-strategy decides); --strategy atomic is sent by
// name, so that a coordinator defaulting to auto still runs one instant.
func TestCutoverStrategyUnset(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--strategy", "atomic"}, "atomic"},
	} {
		f := &fakeCoord{events: sampleEvents(coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED)}
		addr, _ := serve(t, f, nil)
		code, stdout, stderr := run(t, append([]string{"--coordinator", addr, "--insecure", "cutover", "--port", "4889"}, tc.args...)...)
		if code != ExitOK {
			t.Fatalf("%v: exit %d\n%s\n%s", tc.args, code, stdout, stderr)
		}
		if got := f.lastRequest(); !proto.Equal(got, &coordinatorv1.CutoverRequest{Port: 4889, Strategy: tc.want}) {
			t.Errorf("%v: request %v, want strategy %q", tc.args, got, tc.want)
		}
	}
}
