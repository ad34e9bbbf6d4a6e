package coordinator

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// TestResumeAfterCrash kills the coordinator in the middle of each phase
// and starts a new one over the same state dir: it must finish or undo the
// operation, never leave it half done (I1 across a restart).
func TestResumeAfterCrash(t *testing.T) {
	block := func(method string, after bool) func(l *lab) {
		return func(l *lab) { l.fakes["n2"].SetFault(method, fakeagent.Fault{Delay: 30 * time.Second, After: after}) }
	}
	cases := []struct {
		name   string
		setup  func(l *lab)
		step   string // journaled step at which to crash
		called string // ...once n2 received this call
		want   coordinatorv1.OperationState
		dump   string
	}{
		{"during prepare", block("Prepare", false), "prepare", "Prepare", aborted, `
			n1 port=4789 op=op1 phase=ABORTED
			n2 port=4789
			n3 port=4789 op=op1 phase=ABORTED`},
		{"during commit, n2 never applied", block("Commit", false), "commit", "Commit", rolledBack, `
			n1 port=4789 op=op1 phase=REVERTED
			n2 port=4789 op=op1 phase=ABORTED
			n3 port=4789 op=op1 phase=REVERTED`},
		{"during commit, all applied", block("Commit", true), "commit", "Commit", succeeded, `
			n1 port=4889 op=op1 phase=FINALIZED
			n2 port=4889 op=op1 phase=FINALIZED
			n3 port=4889 op=op1 phase=FINALIZED`},
		{"during confirm", block("Confirm", false), "confirm", "Confirm", succeeded, `
			n1 port=4889 op=op1 phase=FINALIZED
			n2 port=4889 op=op1 phase=FINALIZED
			n3 port=4889 op=op1 phase=FINALIZED`},
		{"during rollback", func(l *lab) {
			l.fakes["n1"].SetFault("Commit", fakeagent.Fault{Err: context.Canceled})
			block("Rollback", false)(l)
		}, "rollback", "Rollback", rolledBack, `
			n1 port=4789 op=op1 phase=ABORTED
			n2 port=4789 op=op1 phase=REVERTED
			n3 port=4789 op=op1 phase=REVERTED`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t, 3, nil)
			tc.setup(l)
			go func() { _, _, _ = l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op1"}) }()
			deadline := time.Now().Add(10 * time.Second)
			committed := func(ns ...string) bool {
				for _, n := range ns {
					if !strings.Contains(l.fakes[n].Dump(), "COMMITTED") {
						return false
					}
				}
				return true
			}
			settled := func() bool {
				switch tc.name {
				case "during prepare":
					return strings.Contains(l.fakes["n1"].Dump(), "PREPARED") && strings.Contains(l.fakes["n3"].Dump(), "PREPARED")
				case "during commit, n2 never applied":
					return committed("n1", "n3")
				case "during commit, all applied":
					return committed("n1", "n2", "n3")
				}
				return true
			}
			for !l.fakes["n2"].Called(tc.called) || journalStep(t, l.dir, "op1") != tc.step || !settled() {
				if time.Now().After(deadline) {
					t.Fatalf("never reached %s (journal step %q)", tc.step, journalStep(t, l.dir, "op1"))
				}
				time.Sleep(2 * time.Millisecond)
			}
			l.crash()
			for _, f := range l.fakes {
				for _, m := range []string{"Prepare", "Commit", "Confirm", "Rollback"} {
					f.SetFault(m, fakeagent.Fault{})
				}
			}
			l.start() // a new coordinator over the same journal: Resume runs in it
			l.c.Wait()
			st, err := l.client.Status(context.Background(), &coordinatorv1.StatusRequest{OperationId: "op1"})
			if err != nil {
				t.Fatal(err)
			}
			if st.State != tc.want {
				t.Fatalf("after restart: %s (%s), want %s\n%s", st.State, st.Error, tc.want, l.dump())
			}
			wantDump(t, l.dump(), tc.dump)
			// The change record survives the restart: who asked, the plan,
			// and the events of both runs, in order.
			var evs []string
			for _, e := range st.Events {
				evs = append(evs, e.Phase+": "+e.Message)
			}
			log := strings.Join(evs, "\n")
			// (events after the last journal write before the crash are lost)
			before, after := strings.Index(log, "preflight: preflight passed"), strings.Index(log, "resume: coordinator restarted")
			if before < 0 || after < before || st.RequestedBy == "" || len(st.Plan.GetNodes()) != 3 {
				t.Errorf("record after restart: requested_by %q, plan %d nodes, events:\n%s", st.RequestedBy, len(st.Plan.GetNodes()), log)
			}
			if got := journalStep(t, l.dir, "op1"); got != "done" {
				t.Errorf("journal step %q after resume", got)
			}
		})
	}
}

func journalStep(t *testing.T, dir, id string) string {
	b, err := os.ReadFile(filepath.Join(dir, "operations", id+".json"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), `"step": "`); ok {
			return strings.TrimSuffix(v, `",`)
		}
	}
	return ""
}
