package faults_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
)

func (e *env) heal(node string) {
	if err := e.l.Heal(e.ctx, node); err != nil {
		e.t.Error(err)
	}
}

// n1 cut off from the coordinator (nftables drop of the control port in
// its namespace) after it prepared, before commit. Expected: ROLL BACK of
// the nodes that flipped (n2, n3); n1 never gets the commit and aborts by
// itself at its prepare timeout; the coordinator cannot reach n1 for the
// rollback and says so (FAILED naming n1). One port: 4789.
func TestPartitionBeforeCommit(t *testing.T) {
	e := newEnv(t, "pbc")
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	e.waitPhase("n1", "PREPARED", 5*time.Second)
	time.Sleep(50 * time.Millisecond)
	if err := e.l.Partition(e.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.heal("n1") })
	t0 := time.Now()
	if err := lab.Thaw(n3); err != nil {
		t.Fatal(err)
	}
	e.waitPhase("n1", "ABORTED", prepareTimeout+2*time.Second)
	r := wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	e.heal("n1")
	e.assertClean(port)
	out := e.assertAgree(port)
	rec := e.record("n1")
	if rec.RevertedBy != "prepare-timeout" {
		t.Errorf("n1 aborted by %q, want prepare-timeout", rec.RevertedBy)
	}
	// n2 and n3 flipped and were rolled back; n1 cannot be reached for the
	// rollback during the whole retry window (the dead-man + 1 s), so the
	// coordinator cannot know it undid the prepare: FAILED, operator
	// needed, naming n1 — never a clean "rolled back".
	if out != "failed" || r.code != 5 {
		t.Errorf("outcome %s exit %d, want failed exit 5 (n1 unreachable for the rollback)", out, r.code)
	}
	if !strings.Contains(r.out, "n1") {
		t.Errorf("report does not name n1:\n%s", r.out)
	}
	e.fact("n1 partitioned from the coordinator", "after prepare, before commit", "roll back n2,n3; n1 aborts at its prepare timeout; report names n1",
		out+", exit "+itoa(r.code)+", n1 "+rec.Phase+" by "+rec.RevertedBy, took)
}

// n1 cut off after it applied the commit: the coordinator is frozen the
// moment n1 records COMMITTED (before the flip instant), n1 partitioned,
// the coordinator released. Expected: ROLL BACK — the coordinator never
// gets n1's answer and rolls back n2 and n3; n1's dead-man reverts it by
// itself: both undo to 4789 and agree. The commit lead is 1 s so that the
// freeze lands before the instant on a loaded machine too (the default
// lead is tens of milliseconds, which a poll can miss).
func TestPartitionAfterCommit(t *testing.T) {
	e := newEnv(t, "pac", withCommitLead(time.Second))
	wait := e.coordctlBG("cutover", "--port", "4889")
	coord := e.proc("hub")
	if !spinUntil(15*time.Second, func() bool { return e.phase("n1") == "COMMITTED" }) {
		t.Fatalf("n1 never committed: %+v", e.record("n1"))
	}
	_ = lab.Freeze(coord)
	err := e.l.Partition(e.ctx, "n1")
	early := e.record("n1").Applied == ""
	_ = lab.Thaw(coord)
	if err != nil {
		t.Fatal(err)
	}
	if !early {
		t.Errorf("n1 had applied before the partition: the fault did not land before the instant")
	}
	t.Cleanup(func() { e.heal("n1") })
	t0 := time.Now()
	e.waitPhase("n1", "REVERTED", deadman+3*time.Second)
	r := wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	e.heal("n1")
	e.assertClean(port)
	out := e.assertAgree(port)
	rec := e.record("n1")
	if rec.Phase != "REVERTED" || rec.RevertedBy != "deadman" || rec.Applied == "" {
		t.Errorf("n1 %s by %q (applied %q), want REVERTED by deadman after applying", rec.Phase, rec.RevertedBy, rec.Applied)
	}
	// Nothing can confirm or reach n1 for the whole retry window: FAILED
	// naming n1 and its dead-man, exit 5.
	if out != "failed" || r.code != 5 {
		t.Errorf("outcome %s exit %d, want failed exit 5 (n1 unreachable)", out, r.code)
	}
	if !strings.Contains(r.out, "n1") {
		t.Errorf("report does not name n1:\n%s", r.out)
	}
	e.fact("n1 partitioned from the coordinator", "after commit (n1 applied), before confirm", "roll back n2,n3; n1's dead-man reverts it",
		out+", exit "+itoa(r.code)+", n1 "+rec.Phase+" by "+rec.RevertedBy, took)
}

// A slow agent: n1 frozen (SIGSTOP) when the operation starts and released
// after the prepare deadline, so its Prepare is handled late. Expected:
// ABORT — the coordinator times n1 out and aborts; n1's late prepare is
// refused or undone (no firewall opening left).
func TestSlowAgentAfterPrepareDeadline(t *testing.T) {
	e := newEnv(t, "slw")
	wait := e.coordctlBG("cutover", "--port", "4889")
	n1 := e.holdPrepare("n1")
	time.Sleep(2*stepTimeout + 500*time.Millisecond)
	landed := e.journal()
	if err := lab.Thaw(n1); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	r := wait()
	t.Logf("landed: journal step %s; coordctl exit %d:\n%s", landed.Step, r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	// n1 may handle its queued Prepare now: give it time, then check
	// nothing stays open.
	time.Sleep(500 * time.Millisecond)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "aborted" || r.code != 1 {
		t.Errorf("outcome %s exit %d, want aborted exit 1", out, r.code)
	}
	if p := e.phase("n1"); p != "" && p != "ABORTED" {
		t.Errorf("n1's record %s, want none or ABORTED (the late prepare refused or undone)", p)
	}
	e.fact("slow agent (n1 frozen "+(2*stepTimeout+500*time.Millisecond).String()+")", "prepare, answers after the deadline", "abort; late prepare refused or undone",
		out+", exit "+itoa(r.code)+", n1 "+e.phase("n1"), took)
}

// n1's state dir becomes unwritable (read-only bind mount, as root) after
// it prepared. Expected: n1 refuses the commit before any change (it
// cannot record it), so ROLL BACK; n1's abort goes ahead without a record
// and a restarted n1 (dir writable again) aborts the stale PREPARED record
// once more (idempotent). Before an operation the same fault makes
// preflight refuse: nothing changes.
func TestStateDirUnwritable(t *testing.T) {
	e := newEnv(t, "ro")
	// Before: preflight refuses, nothing changes.
	restore, err := e.l.MakeStateDirUnwritable(e.ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	r := e.coordctl("cutover", "--port", "4889")
	t.Logf("cutover with n1's state dir read-only: exit %d\n%s", r.code, r.out)
	if r.code != 4 || !strings.Contains(r.out, "n1") || !strings.Contains(r.out, "state") {
		t.Errorf("exit %d, want 4 (preflight refused) naming n1's state dir", r.code)
	}
	e.assertUnchanged(e.base)
	if err := restore(); err != nil {
		t.Fatal(err)
	}

	// During: after prepare.
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	e.waitPhase("n1", "PREPARED", 5*time.Second)
	if restore, err = e.l.MakeStateDirUnwritable(e.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_ = lab.Thaw(n3)
	r = wait()
	t.Logf("coordctl exit %d:\n%s", r.code, r.out)
	port, took := e.consistent(t0, fromPort)
	disk := e.phase("n1")
	if _, err := e.l.KillAgent("n1", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = restore()
	e.startAgent("n1")
	// The stale PREPARED record is re-armed on restart and aborted at its
	// prepare deadline (prepareTimeout after n1's Prepare), not at once.
	e.waitPhase("n1", "ABORTED", prepareTimeout+2*time.Second)
	e.assertClean(port)
	out := e.assertAgree(port)
	t.Logf("n1's record on disk while read-only: %s; after a restart: %s", disk, e.phase("n1"))
	// n1 refused the commit before any change (it cannot record it); the
	// others were rolled back, and n1's abort answered (in memory), so
	// the operation is a clean rollback, exit 1.
	if out != "rolled-back" || r.code != 1 {
		t.Errorf("outcome %s exit %d, want rolled-back exit 1", out, r.code)
	}
	if disk != "PREPARED" {
		t.Errorf("n1's record on the read-only dir %q, want PREPARED (it could not be written)", disk)
	}
	if by := e.record("n1").RevertedBy; by != "prepare-timeout" {
		t.Errorf("restarted n1 aborted its stale record by %q, want prepare-timeout", by)
	}
	e.fact("n1's state dir read-only (bind mount)", "before any operation", "preflight refuses, nothing changes", "refused, exit 4", 0)
	e.fact("n1's state dir read-only (bind mount)", "after prepare", "n1 refuses commit; roll back; stale record re-aborted on restart",
		out+", exit "+itoa(r.code)+", n1 on disk "+disk+" then "+e.phase("n1")+" by "+e.record("n1").RevertedBy, took)
}

// assertUnchanged checks OVS ports, iptables, flows, every agent state
// file and every journal file are byte for byte what they were; running
// names journal files of an operation that is in progress meanwhile (its
// own record moves on, but no file may appear or disappear).
func (e *env) assertUnchanged(before snapshot, running ...string) {
	e.t.Helper()
	now := e.snap()
	for _, n := range nodes {
		if now.Ports[n] != before.Ports[n] {
			e.t.Errorf("%s: port %d, was %d", n, now.Ports[n], before.Ports[n])
		}
		if now.IPT[n] != before.IPT[n] {
			e.t.Errorf("%s: iptables changed:\n%s\nwas\n%s", n, now.IPT[n], before.IPT[n])
		}
		if now.Flows[n] != before.Flows[n] {
			e.t.Errorf("%s: flows changed", n)
		}
		if now.State[n] != before.State[n] {
			e.t.Errorf("%s: state file changed:\n%s\nwas\n%s", n, now.State[n], before.State[n])
		}
	}
	if len(now.Journal) != len(before.Journal) {
		e.t.Errorf("journal files %d, were %d", len(now.Journal), len(before.Journal))
	}
	for k, v := range before.Journal {
		if now.Journal[k] != v && !slices.Contains(running, k) {
			e.t.Errorf("journal %s changed", k)
		}
	}
}

// A second cutover, and a second coordinator, while one operation runs
// (held at its prepare barrier by a frozen n3). Expected: both REFUSED,
// naming the running operation; the running one then finishes normally.
func TestSecondOperationRefused(t *testing.T) {
	// Long steps: the first operation stays held at its prepare barrier
	// for everything below (a few seconds, more on a loaded machine). With
	// a 20 s step (dead-man 45 s) and a 60 s prepare timeout it cannot time
	// out meanwhile, so it succeeds every time: one outcome, not "aborted
	// or succeeded depending on load".
	e := newEnv(t, "two", func(c *lab.Config) {
		c.ExtraCoordinatorArgs = append(c.ExtraCoordinatorArgs, "--step-timeout", "20s", "--deadman", "45s")
		c.ExtraAgentArgs = append(c.ExtraAgentArgs, "--prepare-timeout", "60s")
	})
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	// The coordinator resets the probe counters alongside Prepare (within
	// 1 s); a loaded machine may still take a while.
	e.waitPhase("n1", "PREPARED", 9*time.Second)
	running := e.journal().ID

	r1 := e.coordctl("cutover", "--port", "4999")
	t.Logf("second cutover: exit %d\n%s", r1.code, r1.out)
	if r1.code != 4 || !strings.Contains(r1.out, running) {
		t.Errorf("second cutover exit %d, want 4 (refused) naming %s", r1.code, running)
	}

	// A second coordinator of its own (other ports, other journal): the
	// agents' preflight names the operation in flight.
	second, err := e.l.SpawnCoordinator("--listen", "198.18.128.1:9446", "--metrics-listen", "198.18.128.1:9447",
		"--state-dir", filepath.Join(e.l.Dir(), "coordinator2"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	r2 := e.coordctl("--coordinator", "198.18.128.1:9446", "cutover", "--port", "4999")
	t.Logf("cutover through a second coordinator: exit %d\n%s", r2.code, r2.out)
	if r2.code != 4 || !strings.Contains(r2.out, running) {
		t.Errorf("second coordinator's cutover exit %d, want 4 (refused by preflight) naming %s", r2.code, running)
	}
	_ = lab.Signal(second, syscall.SIGKILL)
	_ = lab.WaitExit(second, 5*time.Second)

	// A second coordinator on the SAME journal (a mistaken second replica):
	// it must refuse to start (the journal is locked), naming the running
	// coordinator's PID, not resume the operation behind its back.
	first := e.proc("hub")
	third, err := e.l.SpawnCoordinator("--listen", "198.18.128.1:9448", "--metrics-listen", "198.18.128.1:9449")
	if err != nil {
		t.Fatal(err)
	}
	sameJournal := "refused to start"
	if !waitUntil(5*time.Second, func() bool { return !third.Alive() }) {
		sameJournal = "started and runs on the same journal"
		b, _ := os.ReadFile(filepath.Join(e.l.Dir(), "coordinator.log"))
		t.Errorf("a second coordinator on the same --state-dir started:\n%s", tail(string(b), 1500))
		_ = lab.Signal(third, syscall.SIGKILL)
		_ = lab.WaitExit(third, 5*time.Second)
	} else {
		b, _ := os.ReadFile(filepath.Join(e.l.Dir(), "coordinator.log"))
		want := fmt.Sprintf("in use by another coordinator, PID %d", first.PID)
		if !strings.Contains(string(b), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, tail(string(b), 1500))
		}
		sameJournal += ", naming PID " + itoa(first.PID)
	}
	if j := e.journal(); j.ID != running || j.Outcome != "pending" {
		t.Errorf("the running operation was touched: journal %+v", j)
	}

	t0 := time.Now()
	_ = lab.Thaw(n3)
	r := wait()
	t.Logf("first cutover: exit %d\n%s", r.code, r.out)
	port, took := e.consistent(t0, toPort)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "succeeded" || r.code != 0 {
		t.Errorf("first operation: outcome %s exit %d, want succeeded exit 0 (untouched by the refused ones)", out, r.code)
	}
	e.fact("second cutover (same coordinator)", "prepare of the first", "refused naming the running op", "exit "+itoa(r1.code)+": refused, names it", 0)
	e.fact("second coordinator, own journal", "prepare of the first", "refused by the agents' preflight naming the running op", "exit "+itoa(r2.code)+": refused", 0)
	e.fact("second coordinator, same journal", "prepare of the first", "refuses to start", sameJournal, 0)
	e.fact("(the first operation)", "after the above", "finishes untouched: succeeded", out+", exit "+itoa(r.code), took)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
