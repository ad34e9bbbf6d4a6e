package kube

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// eventDump lists the Events in ns as "Type Reason: message" lines in
// creation order (Event names carry a nanosecond timestamp).
func eventDump(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	l, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(l.Items, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
	var b strings.Builder
	for _, e := range l.Items {
		b.WriteString(e.Type + " " + e.Reason + ": " + e.Message + "\n")
	}
	return b.String()
}

func TestMilestoneEvents(t *testing.T) {
	cs := versioned()
	j := journal(t, cs, "coord-0")
	ref := LeaseRef(context.Background(), cs, "cutover", "cutover-coordinator")
	rc := NewRecorder(cs, ref, "coord-0", nil)
	m := WithMilestones(j, rc)
	r := rec("op-1", 1, "preflight", "pending")
	steps := []struct{ step, outcome string }{
		{"preflight", "pending"}, {"prepare", "pending"}, {"prepare", "pending"}, {"commit", "pending"},
		{"verify", "pending"}, {"confirm", "pending"}, {"finalize", "pending"}, {"done", "succeeded"},
		{"rollback", "pending"}, {"done", "rolled-back"},
	}
	for _, s := range steps {
		r.Step, r.Outcome = s.step, s.outcome
		if err := m.Save(r); err != nil {
			t.Fatal(err)
		}
	}
	// A second operation that aborts, seen by a new leader after a resume.
	r2 := rec("op-2", 2, "prepare", "pending")
	if err := j.Save(r2); err != nil {
		t.Fatal(err)
	}
	m2 := WithMilestones(journal(t, cs, "coord-1"), rc)
	if _, err := m2.Load(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"abort", "done"} {
		r2.Step = s
		if s == "done" {
			r2.Outcome = "aborted"
		}
		if err := m2.Save(r2); err != nil {
			t.Fatal(err)
		}
	}
	rc.Close()
	want := `Normal OperationStarted: operation op-1: cutover of 2 node(s) from port 4789 to 4889 started
Normal OperationPrepared: operation op-1: every node prepared port 4889; committing
Normal OperationCommitted: operation op-1: every node flipped to port 4889; verifying
Normal OperationConfirmed: operation op-1: every node confirmed port 4889; dead-man timers disarmed
Normal OperationSucceeded: operation op-1: 2 node(s) moved from port 4789 to 4889
Warning OperationRollingBack: operation op-1: rollback to port 4789 under way
Warning OperationRolledBack: operation op-1: rolled back; every node is back on port 4789
Warning OperationRollingBack: operation op-2: abort to port 4789 under way
Warning OperationAborted: operation op-2: aborted before any node flipped; every node stays on port 4789
`
	if got := eventDump(t, cs, "cutover"); got != want {
		t.Errorf("events:\n%s\nwant:\n%s", got, want)
	}
	l, _ := cs.CoreV1().Events("cutover").List(context.Background(), metav1.ListOptions{})
	e := l.Items[0]
	if e.InvolvedObject.Kind != "Lease" || e.InvolvedObject.Name != "cutover-coordinator" || e.ReportingController != "cutover.dev/coordinator" || e.Source.Host == "" {
		t.Errorf("event %+v", e)
	}
}

func TestMilestonesHeld(t *testing.T) {
	prev := rec("op-7", 1, "confirm", "pending")
	r := rec("op-7", 1, "done", "held")
	r.Nodes, r.Switched = []string{"a", "b", "c"}, []string{"a"}
	got := milestones(prev, true, r)
	if len(got) != 1 || got[0].reason != ReasonHeld || got[0].typ != corev1.EventTypeNormal || !strings.Contains(got[0].msg, "held: 1 of 3 node(s) send port") {
		t.Errorf("%+v", got)
	}
}

func TestMilestonesFailed(t *testing.T) {
	prev := rec("op-9", 1, "rollback", "pending")
	got := milestones(prev, true, rec("op-9", 1, "done", "failed"))
	if len(got) != 1 || got[0].reason != ReasonFailed || got[0].typ != corev1.EventTypeWarning ||
		got[0].msg != "operation op-9: ended failed: an operator must check the nodes (coordctl status op-9)" {
		t.Errorf("%+v", got)
	}
	// A failed save emits nothing.
	m := WithMilestones(failing{}, nil)
	if err := m.Save(rec("x", 1, "prepare", "pending")); err == nil {
		t.Error("no error")
	}
}

type failing struct{}

func (failing) Save(coordinator.Record) error       { return context.DeadlineExceeded }
func (failing) Load() ([]coordinator.Record, error) { return nil, nil }
