package cluster_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tier's tests read the next steps from kubectl cutover's output;
// coordctl's render golden is that output, so the parser is held to it
// here, without a cluster: a wrapped step's text joined, its command on a
// line of its own, whole.
func TestPrintedNextStepsReadTheRenderedReport(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "coordinator", "cli", "testdata", "render.golden"))
	if err != nil {
		t.Fatal(err)
	}
	_, report, ok := strings.Cut(string(b), "== report (next steps)\n")
	if !ok {
		t.Fatal("render.golden has no report with next steps")
	}
	report, _, _ = strings.Cut(report, "\n== ")
	steps := printedNextSteps(report)
	if len(steps) != 1 {
		t.Fatalf("read %d steps, want 1: %+v", len(steps), steps)
	}
	st := steps[0]
	if !strings.Contains(st.text, "restart flanneld one node at a time so that it reads Backend.Port 4889 (it keeps the port it read at start") {
		t.Errorf("step text %q: the wrapped lines are not joined", st.text)
	}
	if len(st.cmds) != 1 || st.cmds[0] != "kubectl -n kube-flannel rollout restart daemonset/kube-flannel-ds && kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds" {
		t.Errorf("step commands %q, want the one command line, whole", st.cmds)
	}
}
