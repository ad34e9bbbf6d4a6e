package faults_test

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
)

// proc returns node's running agent (or the coordinator for "hub").
func (e *env) proc(node string) lab.Proc {
	e.t.Helper()
	role := "agent"
	if node == "hub" {
		role = "coordinator"
	}
	p, err := e.l.Proc(role, node)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// holdPrepare freezes node's agent at the operation's first durable trace
// (the journal record written when preflight passed), so the coordinator
// waits at the prepare barrier for it while the other agents prepare.
func (e *env) holdPrepare(node string) lab.Proc {
	e.t.Helper()
	p := e.proc(node)
	if !spinUntil(10*time.Second, func() bool { return e.journal().ID != "" }) {
		e.t.Fatal("no journal record within 10s: the cutover did not start")
	}
	if err := lab.Freeze(p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// waitPhase waits until node's agent record says phase.
func (e *env) waitPhase(node, phase string, d time.Duration) {
	e.t.Helper()
	if !waitUntil(d, func() bool { return e.phase(node) == phase }) {
		e.t.Fatalf("%s: agent record %q, want %s within %s", node, e.phase(node), phase, d)
	}
}

func (e *env) startAgent(node string) {
	e.t.Helper()
	if _, err := e.l.StartAgent(e.ctx, node); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) kill(node string) {
	e.t.Helper()
	var err error
	if node == "hub" {
		_, err = e.l.KillCoordinator(syscall.SIGKILL)
	} else {
		_, err = e.l.KillAgent(node, syscall.SIGKILL)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// kill -9 of agent n1 while the coordinator waits for its Prepare (the
// agent frozen when the operation starts, its Prepare queued in its
// socket), then restarted as its DaemonSet would. Expected: ABORT — n1
// never prepared; n2 and n3 undo their opening; nothing flipped.
func TestAgentKilledDuringPrepare(t *testing.T) {
	e := newEnv(t, "akp")
	wait := e.coordctlBG("cutover", "--port", "4889")
	p := e.holdPrepare("n1")
	e.waitPhase("n2", "PREPARED", 5*time.Second)
	e.waitPhase("n3", "PREPARED", 5*time.Second)
	landed := e.journal().Step
	if landed != "prepare" || e.phase("n1") != "" {
		t.Fatalf("landed in journal step %q with n1 record %q, want prepare and none", landed, e.phase("n1"))
	}
	t0 := time.Now()
	e.kill("n1")
	_ = p
	e.startAgent("n1")
	r := wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "aborted" || r.code != 1 {
		// The abort is retried with back-off until n1 is back (it never
		// prepared: its Rollback answers "unknown operation").
		t.Errorf("outcome %s exit %d, want aborted exit 1: an agent that restarted during prepare must not make the operation FAILED", out, r.code)
	}
	if !strings.Contains(r.out, "n1") {
		t.Errorf("report does not name n1:\n%s", r.out)
	}
	e.fact("agent kill -9 (n1), restarted", "prepare (n1's Prepare queued)", "abort, 4789 everywhere", out+", exit "+itoa(r.code), took)
}

// kill -9 of n1 after it recorded PREPARED while the prepare barrier still
// waits for n3 (frozen), then n1 restarted and n3 released. Expected:
// CONVERGE — the restarted n1 resumes PREPARED from its state file and
// takes the commit with the others.
func TestAgentKilledBetweenPrepareAndCommit(t *testing.T) {
	e := newEnv(t, "akb")
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	e.waitPhase("n1", "PREPARED", 5*time.Second)
	time.Sleep(50 * time.Millisecond) // let n1's answer reach the coordinator
	t0 := time.Now()
	e.kill("n1")
	e.startAgent("n1")
	if err := lab.Thaw(n3); err != nil {
		t.Fatal(err)
	}
	r := wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	port, took := e.consistent(t0, 0)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "succeeded" || r.code != 0 {
		t.Errorf("outcome %s exit %d, want succeeded exit 0: a restarted agent resumes PREPARED from its state file", out, r.code)
	}
	e.fact("agent kill -9 (n1), restarted", "between prepare and commit", "converge on 4889", out+", exit "+itoa(r.code), took)
}

// The same kill, but n1 stays down until the coordinator has given up.
// Expected: ROLL BACK of n2 and n3 (they flipped), FAILED naming n1 (its
// rollback unreachable); n1 never flipped, and once restarted it aborts
// the prepare by itself (its prepare deadline passed while it was down).
func TestAgentKilledBetweenPrepareAndCommitStaysDown(t *testing.T) {
	e := newEnv(t, "akd")
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	e.waitPhase("n1", "PREPARED", 5*time.Second)
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	e.kill("n1")
	if err := lab.Thaw(n3); err != nil {
		t.Fatal(err)
	}
	r := wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	// n1's agent is down but its OVS is reachable: every node must be on
	// the old port already (n1 never flipped, n2 and n3 rolled back).
	port, took := e.consistent(t0, fromPort)
	if e.phase("n1") != "PREPARED" {
		t.Errorf("n1's record %s, want PREPARED (it died prepared)", e.phase("n1"))
	}
	// Restarted after its prepare deadline: aborts by itself.
	waitUntil(prepareTimeout, func() bool { return false })
	e.startAgent("n1")
	e.waitPhase("n1", "ABORTED", 5*time.Second)
	if by := e.record("n1").RevertedBy; by != "prepare-timeout" {
		t.Errorf("n1 aborted by %q, want prepare-timeout", by)
	}
	e.assertClean(port)
	out := e.assertAgree(port)
	// n1 is down for the whole retry window of the rollback (the
	// dead-man + 1 s): the coordinator cannot know it undid its prepare,
	// so the operation is FAILED naming n1, exit 5, every time.
	if out != "failed" || r.code != 5 {
		t.Errorf("outcome %s exit %d, want failed exit 5 (n1 unreachable)", out, r.code)
	}
	if !strings.Contains(r.out, "n1") {
		t.Errorf("report does not name n1:\n%s", r.out)
	}
	e.fact("agent kill -9 (n1), not restarted", "between prepare and commit", "roll back n2,n3; n1 aborts itself on restart", out+", exit "+itoa(r.code)+", n1 "+e.record("n1").RevertedBy, took)
}

// kill -9 of n1 right after it applied the commit (record COMMITTED with
// the applied instant), before any confirm; restarted 1 s later.
// Expected: ROLL BACK — the coordinator cannot verify n1; the restarted
// n1 resumes COMMITTED with its persisted dead-man deadline and is reverted
// (by the coordinator's rollback or, failing that, by its own dead-man).
//
// Landing it: between n1's apply and the coordinator's confirm there are
// only the commit answers and verify, tens of milliseconds, and a poll of
// n1's record lost that race on a loaded CI machine (n1 was killed in
// finalize). So the commit lead is 1 s, and once every agent holds its
// Commit (the instant still ~1 s away) the coordinator is frozen: the
// agents apply at the instant on their own, and nothing can confirm until
// n1 is dead and the coordinator thawed.
func TestAgentKilledAfterCommit(t *testing.T) {
	e := newEnv(t, "aka", withCommitLead(time.Second))
	wait := e.coordctlBG("cutover", "--port", "4889")
	p := e.proc("n1")
	thaw := e.freezeAtCommit()
	if !waitUntil(5*time.Second, func() bool { return e.record("n1").Applied != "" }) {
		t.Fatalf("n1 never applied its commit: %+v", e.record("n1"))
	}
	_ = lab.Signal(p, syscall.SIGKILL)
	t0 := time.Now()
	landed := e.journal()
	_ = lab.WaitExit(p, 5*time.Second)
	thaw()
	// The premise: n1 died after its apply and before any confirm went out.
	if !landed.CommitSent || (landed.Step != "commit" && landed.Step != "verify") {
		t.Errorf("the kill landed at journal step %s commit_sent %v, want commit or verify with the commit sent", landed.Step, landed.CommitSent)
	}
	time.Sleep(time.Second)
	e.startAgent("n1")
	r := wait()
	t.Logf("landed: journal step %s commit_sent %v; coordctl exit %d:\n%s", landed.Step, landed.CommitSent, r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "rolled-back" || r.code != 1 {
		// The rollback is retried with back-off until n1 is back; it
		// resumed COMMITTED from its state file and takes the rollback.
		t.Errorf("outcome %s exit %d, want rolled-back exit 1: an agent restarting after commit must be reached by a later attempt", out, r.code)
	}
	rec := e.record("n1")
	if rec.Phase != "REVERTED" {
		t.Errorf("n1 %s, want REVERTED", rec.Phase)
	}
	e.fact("agent kill -9 (n1), restarted after 1 s", "after commit, before confirm (journal "+landed.Step+")", "roll back to 4789",
		out+", exit "+itoa(r.code)+", n1 reverted by "+rec.RevertedBy, took)
}

func itoa(i int) string { return strconv.Itoa(i) }
