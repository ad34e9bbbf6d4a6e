package faults_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
)

func (e *env) startCoordinator() {
	e.t.Helper()
	if _, err := e.l.StartCoordinator(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

// kill -9 of the coordinator at each phase, then a restart: it resumes from
// its journal or rolls back. Each case lands by spinning on the journal
// (the coordinator journals a step before its first call goes out) or, for
// prepare, by holding the prepare barrier with a frozen agent.
func TestCoordinatorKilled(t *testing.T) {
	cases := []struct {
		name, tag string
		hold      string // agent frozen at the start to hold the prepare barrier
		// dropRequests: once n1 and n2 prepared, drop the coordinator's
		// requests to every agent (lab.DropRequests) before the held agent
		// is released.
		dropRequests bool
		// holdVerify: the verify step is held open by n3, frozen after it
		// applied and answered its commit, so the kill lands in verify
		// (a poll alone races a verify of tens of milliseconds).
		holdVerify bool
		until      func(journalRec) bool
		restartIn  time.Duration
		expected   string   // written down before running
		outcomes   []string // journal outcomes that meet it
		port       int
	}{
		{name: "prepare", tag: "ckp", hold: "n3", until: func(j journalRec) bool { return j.Step == "prepare" },
			expected: "abort: commit never sent", outcomes: []string{"aborted"}, port: fromPort},
		// Deterministic: every agent prepared, the coordinator's requests
		// to the agents dropped (one way: n3's answer to its queued
		// Prepare still gets out), so the Commit calls journaled as sent
		// reach no agent. Once the agents are reachable again the restarted
		// coordinator finds nobody committed and rolls back.
		{name: "commit", tag: "ckc", hold: "n3", dropRequests: true, until: func(j journalRec) bool { return j.CommitSent },
			expected: "roll back: commit journaled as sent, received by no agent", outcomes: []string{"rolled-back"}, port: fromPort},
		{name: "verify", tag: "ckv", holdVerify: true, until: func(j journalRec) bool { return j.Step == "verify" },
			expected: "converge: every agent committed, resume at verify", outcomes: []string{"succeeded"}, port: toPort},
		{name: "verify-restart-after-deadman", tag: "ckd", holdVerify: true, until: func(j journalRec) bool { return j.Step == "verify" },
			restartIn: deadman + time.Second,
			expected:  "roll back: the agents' dead-man reverted them first; the journal agrees", outcomes: []string{"rolled-back"}, port: fromPort},
		{name: "finalize", tag: "ckf", until: func(j journalRec) bool { return j.Step == "finalize" },
			expected: "converge: resume, confirm and finalize again (idempotent)", outcomes: []string{"succeeded"}, port: toPort},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mod []func(*lab.Config)
			if tc.holdVerify {
				mod = append(mod, withCommitLead(time.Second))
			}
			e := newEnv(t, tc.tag, mod...)
			wait := e.coordctlBG("cutover", "--port", "4889")
			var held lab.Proc
			if tc.holdVerify {
				held = e.holdVerify("n3")
			}
			if tc.hold != "" {
				held = e.holdPrepare(tc.hold)
				e.waitPhase("n1", "PREPARED", 5*time.Second)
				e.waitPhase("n2", "PREPARED", 5*time.Second)
			}
			if tc.dropRequests {
				// n3's Prepare went out with n1's and n2's: it sits in its
				// socket. Give stragglers a moment, then drop.
				time.Sleep(200 * time.Millisecond)
				for _, n := range nodes {
					if err := e.l.DropRequests(e.ctx, n); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { e.heal(n) })
				}
				_ = lab.Thaw(held)
				e.waitPhase(tc.hold, "PREPARED", 5*time.Second)
			}
			coord := e.proc("hub")
			var landed journalRec
			if !spinUntil(15*time.Second, func() bool { landed = e.journal(); return tc.until(landed) }) {
				t.Fatalf("never landed: journal %+v", landed)
			}
			if err := lab.Signal(coord, 9); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if tc.holdVerify {
				var phases []string
				for _, n := range nodes {
					if ph := e.phase(n); ph != "COMMITTED" {
						phases = append(phases, n+" "+ph)
					}
				}
				if len(phases) > 0 {
					t.Errorf("landing: %s, want every agent COMMITTED (none confirmed)", strings.Join(phases, ", "))
				}
			}
			_ = lab.WaitExit(coord, 5*time.Second)
			r := wait()
			if r.code != 6 {
				t.Errorf("coordctl exit %d when the coordinator died, want 6 (stream ended without a report)\n%s", r.code, r.out)
			}
			if !strings.Contains(r.out, "coordctl status") {
				t.Errorf("coordctl does not point at `coordctl status`:\n%s", r.out)
			}
			if held.PID != 0 {
				_ = lab.Thaw(held)
			}
			if tc.dropRequests {
				// The dead coordinator's connections outlive it as orphans
				// that retransmit its queued Commit: aborted here, or the
				// heal below delivers it (a CI run saw every agent commit
				// the dead coordinator's instant 13-24 ms after the heal,
				// and the restarted coordinator rightly converge on it).
				k, err := e.l.AbortDeadCoordinatorConns(e.ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("aborted %d connection(s) of the dead coordinator", k)
				// Every phase is read before any node is healed: once healed,
				// the dead coordinator's Commit still in its kernel's send
				// queue may be delivered (a CI run saw n1 commit 11 ms after
				// its heal; the restarted coordinator rolled it back), which
				// says nothing of where the kill landed.
				var phases []string
				landedAll := true
				for _, n := range nodes {
					ph := e.phase(n)
					phases = append(phases, n+" "+ph)
					landedAll = landedAll && ph == "PREPARED"
				}
				for _, n := range nodes {
					e.heal(n)
				}
				if !landedAll {
					t.Errorf("landing: %s, want every agent PREPARED (no Commit received)", strings.Join(phases, ", "))
				}
			}
			time.Sleep(tc.restartIn)
			e.startCoordinator()
			var j journalRec
			waitUntil(consistentIn, func() bool { j = e.journal(); return j.Outcome != "pending" && j.Outcome != "" })
			port, took := e.consistent(t0, tc.port)
			e.assertClean(port)
			out := e.assertAgree(port)
			if len(tc.outcomes) != 1 || out != tc.outcomes[0] {
				t.Errorf("outcome %s, want %v (%s)", out, tc.outcomes, tc.expected)
			}
			var by []string
			for _, n := range nodes {
				rec := e.record(n)
				by = append(by, n+" "+rec.Phase+"/"+rec.RevertedBy)
			}
			t.Logf("landed: step %s commit_sent %v; agents: %s", landed.Step, landed.CommitSent, strings.Join(by, ", "))
			e.fact("coordinator kill -9, restarted after "+tc.restartIn.String(), landed.Step, tc.expected, out+" ("+strings.Join(by, ", ")+")", took)
		})
	}
}

// ovs-vswitchd restarted on n1 mid-commit: the agent recorded COMMITTED
// (its deadline persisted, the flip pending at the commit instant) and
// vswitchd goes away and comes back. The port lives in OVSDB, which stays
// up. Expected: CONVERGE — the agent's apply waits for vswitchd's cur_cfg,
// and the step (6 s here, the dead-man 15 s) outlasts a vswitchd restart
// (about 1 s) even on a loaded machine, so the outcome is one: succeeded,
// exit 0. (With a step shorter than the restart the apply would time out
// and the operation roll back: that is the slow-agent case.)
func TestVswitchdRestartMidCommit(t *testing.T) {
	e := newEnv(t, "vsr", func(c *lab.Config) {
		c.ExtraCoordinatorArgs = append(c.ExtraCoordinatorArgs, "--step-timeout", "6s", "--deadman", "15s")
	})
	wait := e.coordctlBG("cutover", "--port", "4889")
	if !spinUntil(15*time.Second, func() bool { return e.phase("n1") == "COMMITTED" }) {
		t.Fatalf("n1 never committed: %+v", e.record("n1"))
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := e.l.RestartVswitchd(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	restarted := time.Since(t0)
	r := wait()
	t.Logf("vswitchd restarted in %s; coordctl exit %d:\n%s", restarted, r.code, r.out)
	port, took := e.consistent(t0, toPort)
	e.assertClean(port)
	out := e.assertAgree(port)
	if out != "succeeded" || r.code != 0 {
		t.Errorf("outcome %s exit %d, want succeeded exit 0", out, r.code)
	}
	e.fact("ovs-vswitchd restart (n1)", "commit (n1 COMMITTED, flip pending)", "converge: succeeded, exit 0", out+", exit "+itoa(r.code), took)
}

// holdVerify holds the next operation's verify open (the caller runs the
// coordinator withCommitLead): the coordinator frozen at the commit
// (freezeAtCommit), once every agent applied (they do on their own at the
// instant, and answer into the frozen coordinator's sockets) node is
// frozen too, and the coordinator thawed. It reads the answers, journals
// verify and waits there for node, which the caller thaws.
func (e *env) holdVerify(node string) lab.Proc {
	e.t.Helper()
	thaw := e.freezeAtCommit()
	applied := waitUntil(5*time.Second, func() bool { return e.everyAgent(func(r agentRecord) bool { return r.Applied != "" }) })
	p := e.proc(node)
	// The commit answer leaves right after the record says applied; give
	// it a moment before freezing the node.
	time.Sleep(100 * time.Millisecond)
	ferr := lab.Freeze(p)
	thaw()
	if ferr != nil {
		e.t.Fatal(ferr)
	}
	e.t.Cleanup(func() { _ = lab.Thaw(p) })
	if !applied {
		e.t.Fatalf("not every agent applied its commit within 5s: %s %+v", node, e.record(node))
	}
	return p
}
