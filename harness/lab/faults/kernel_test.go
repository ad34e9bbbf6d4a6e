package faults_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
)

// TestAgentFrozenAtCommitKernel: on the kernel VXLAN
// backend (flannel.1 on 8472), n2's agent is stopped (SIGSTOP) as soon as
// the coordinator journals the commit, for 6 s, under the product's
// rollback policy and lateness budget, so n1 and n3 flip and are rolled
// back. Expected: ROLLED_BACK (exit 1), every node back on 8472, and once
// n2 has caught up, nothing of Cutover's left on any node: no VXLAN link
// but flannel.1 (the twin that was on 4889, the prebuilt device), no
// socket on udp/4889, the firewall as before; and a retry to the same port
// is planned "may go" (it was refused: the leftover device held 4889,
// which the path check binds).
func TestAgentFrozenAtCommitKernel(t *testing.T) {
	const kernelPort = 8472
	e := newEnv(t, "fzk", func(c *lab.Config) {
		c.Backend = lab.BackendKernelVXLAN
		// The product's lateness budget, not the lab's wider one (as
		// TestLateCommit's rollback case).
		c.ExtraCoordinatorArgs = append(c.ExtraCoordinatorArgs, "--commit-late-policy", "rollback",
			"--commit-late-budget", "200ms", "--commit-answer-deadline", "1s")
	}, withCommitLead(lateLead))
	e.sample()
	p := e.proc("n2")
	var thawOnce sync.Once
	thaw := func() { thawOnce.Do(func() { _ = lab.Thaw(p) }) }
	t.Cleanup(thaw)
	wait := e.coordctlBG("cutover", "--port", "4889", "--strategy", "atomic", "--timeout", "60s")
	if !spinUntil(20*time.Second, func() bool { return e.journal().Step == "commit" }) {
		t.Fatal("no commit journaled within 20s")
	}
	if err := lab.Freeze(p); err != nil {
		t.Fatal(err)
	}
	frozeAt := time.Now()
	early := e.record("n2").Applied == ""
	time.AfterFunc(6*time.Second, thaw)
	r := wait()
	thaw()
	if !early {
		t.Errorf("n2 had applied its commit when it was frozen: the freeze landed after the instant")
	}
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	if got := lateOutcome(t, r.out, r.code); got != "ROLLED_BACK" || r.code != 1 {
		t.Fatalf("outcome %s exit %d, want ROLLED_BACK exit 1", got, r.code)
	}
	e.consistent(frozeAt, kernelPort)
	// n2 thaws into its late commit (aborted: nothing applied) and the
	// rollback: what it prebuilt goes then.
	if !waitUntil(consistentIn, func() bool {
		ph := e.phase("n2")
		return ph == "ABORTED" || ph == "REVERTED"
	}) {
		t.Fatalf("n2: record %q, want ABORTED or REVERTED once thawed", e.phase("n2"))
	}
	for _, n := range nodes {
		links, err := e.l.Exec(e.ctx, n, "ip", "-o", "link", "show", "type", "vxlan")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(links), "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":") != "flannel.1" {
				t.Errorf("%s after the rollback: a VXLAN link besides flannel.1: %s", n, l)
			}
		}
		socks, err := e.l.Exec(e.ctx, n, "ss", "-H", "-uan", "sport", "=", ":4889")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(socks) != "" {
			t.Errorf("%s after the rollback: udp/4889 still held:\n%s", n, socks)
		}
	}
	for _, prob := range cleanProblems(e.base, e.snap(), kernelPort, kernelPort) {
		t.Error(prob)
	}
	if pr := e.coordctl("plan", "--port", "4889"); pr.code != 0 || !strings.Contains(pr.out, "the cutover may go") {
		t.Errorf("plan of a retry to 4889 after the rollback: exit %d, want 0 and \"may go\":\n%s", pr.code, pr.out)
	}
	e.fact("n2 frozen 6s after commit (kernel-vxlan)", "commit", "rolled back, nothing left on 4889, retry may go", "ROLLED_BACK", 0)
}
