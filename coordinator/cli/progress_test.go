package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// stepEvents is a step sent to n nodes answered one by one (1 ms apart,
// node i after i ms), the nodes in fail failing, the ones in silent never
// answering.
func stepEvents(phase string, n int, at int64, fail, silent map[int]bool) []*coordinatorv1.OperationEvent {
	var nodes []string
	for i := 1; i <= n; i++ {
		nodes = append(nodes, fmt.Sprintf("worker-%03d", i))
	}
	evs := []*coordinatorv1.OperationEvent{{Phase: phase, Message: fmt.Sprintf("%s: sending to %d agent(s)", phase, n), StepNodes: nodes, UnixNano: at}}
	for i, node := range nodes {
		if silent[i+1] {
			continue
		}
		e := &coordinatorv1.OperationEvent{Phase: phase, Node: node, NodeDone: true, Message: phase + ": ok", UnixNano: at + int64(i+1)*1_000_000}
		if fail[i+1] {
			e.Failed, e.Message = true, phase+" failed: Internal: iptables: permission denied"
		}
		evs = append(evs, e)
	}
	return evs
}

// TestProgressPlainGolden: without a terminal, a step's answers make one
// summary line (done/total, slowest), failures and unusual answers their
// own lines, an unfinished step names who did not answer.
func TestProgressPlainGolden(t *testing.T) {
	var evs []*coordinatorv1.OperationEvent
	evs = append(evs, &coordinatorv1.OperationEvent{Phase: "preflight", Message: "preflight passed: 4 node(s) on port 4789, target 4889", UnixNano: t0})
	evs = append(evs, stepEvents("prepare", 4, t0+10_000_000, nil, nil)...)
	evs = append(evs, stepEvents("commit", 4, t0+50_000_000, map[int]bool{2: true}, nil)...)
	rb := stepEvents("rollback", 4, t0+90_000_000, nil, map[int]bool{3: true})
	rb[2].Message = "rollback: reached at attempt 2"
	evs = append(evs, rb...)
	evs = append(evs, &coordinatorv1.OperationEvent{Phase: "done", Message: "operation rolled-back", Failed: true, UnixNano: t0 + 200_000_000})
	var b bytes.Buffer
	p := newProgress(&b, false)
	for _, e := range evs {
		p.event(e)
	}
	p.finish()
	out := b.String()
	compareGolden(t, "progress-plain.golden", out)
	if strings.Contains(out, "\x1b") || strings.Contains(out, "\r") {
		t.Errorf("terminal codes in plain output:\n%q", out)
	}
	for _, want := range []string{"4/4 answered in 4.000 ms; slowest worker-004 (4.000 ms)", "4/4 answered (1 failed)", "3/4 answered", "no answer from worker-003", "reached at attempt 2", "permission denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("plain progress lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "prepare: ok") {
		t.Errorf("a plain ok answer printed as its own line:\n%s", out)
	}
}

// TestProgressTTY200: on a terminal, 200 nodes make one live line redrawn
// in place (done/total, who is awaited), not a 200-row table; the step
// ends with its summary line.
func TestProgressTTY200(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, true)
	evs := stepEvents("prepare", 200, t0, nil, nil)
	var mid string
	for i, e := range evs {
		p.event(e)
		if i == 150 {
			mid = b.String()[strings.LastIndex(b.String(), "\r\x1b[K")+1:]
		}
	}
	p.finish()
	out := b.String()
	if !strings.Contains(mid, "prepare: 150/200 answered") || !strings.Contains(mid, "waiting on worker-151, worker-152, worker-153 (+47 more)") {
		t.Errorf("live line at 150 answers: %q", mid)
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d lines written, want 2 (the step sent, its summary):\n%s", n, out)
	}
	if !strings.Contains(out, "200/200 answered in 200.000 ms; slowest worker-200 (200.000 ms)") {
		t.Errorf("no summary:\n%q", out[max(0, len(out)-300):])
	}
	if strings.HasSuffix(out, "waiting") || !strings.HasSuffix(out, "\n") {
		t.Errorf("live line left on the screen: %q", out[max(0, len(out)-100):])
	}
}
