package barrier

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// simAgent is the model of one agent's dataplane for the randomized test.
// Effects happen when the call is "sent" (a timed-out call may or may not
// have taken effect: the test picks at random); the reply is delivered
// later, in random order, possibly twice.
type simAgent struct {
	prepared, applied, confirmed bool
	everApplied                  bool
}

func TestRandomized(t *testing.T) {
	seeds := 3000
	if testing.Short() {
		seeds = 500
	}
	counts := map[Outcome]int{}
	for seed := range seeds {
		counts[runRandom(t, uint64(seed), nil)]++
	}
	t.Logf("outcomes over %d seeds: %v", seeds, counts)
	for _, o := range []Outcome{Succeeded, Aborted, RolledBack, Failed} {
		if counts[o] == 0 {
			t.Errorf("no seed ended %v: the generator does not explore it", o)
		}
	}
}

// runRandom runs one random operation; a violation fails t, or, when
// violated is set, is passed to it (which must not return).
func runRandom(t *testing.T, seed uint64, violated func(string)) Outcome {
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	n := 1 + r.IntN(6)
	var nodes []string
	for i := range n {
		nodes = append(nodes, fmt.Sprintf("n%d", i+1))
	}
	failP := []float64{0, 0.02, 0.1, 0.3}[r.IntN(4)]
	cfg := Config{Nodes: nodes, StepTimeout: time.Second, RollbackAttempts: 1 + r.IntN(3)}
	if r.IntN(2) == 0 {
		// Back-off and a time to cover: retries beyond the count.
		cfg.RetryBackoff = time.Duration(1+r.IntN(500)) * time.Millisecond
		cfg.RetryBackoffMax = time.Duration(r.IntN(3)) * time.Second
		cfg.RetryFor = time.Duration(r.IntN(10)) * time.Second
	}
	for i := range r.IntN(3) {
		cfg.Hooks = append(cfg.Hooks, fmt.Sprintf("h%d", i+1))
	}
	cfg.Verifier = r.IntN(2) == 0
	cfg.Probes = r.IntN(2) == 0
	staged := r.IntN(2) == 0
	if staged {
		// Contiguous batches of random sizes.
		for i := 0; i < n; {
			k := 1 + r.IntN(n-i)
			cfg.Batches = append(cfg.Batches, slices.Clone(nodes[i:i+k]))
			i += k
		}
	}
	// Drawn last, so the draws above stay those of earlier seeds.
	if r.IntN(2) == 0 {
		cfg.LateBudget = 200 * time.Millisecond
	}
	op := New(cfg)
	agents := map[string]*simAgent{}
	// What the application was asked to do, to check the core's ordering.
	var (
		journaled     *Journal // the Journal just before, in the same batch
		resetPending  = false  // ResetProbes asked, ProbesReset not yet fed
		readProbes    = false  // ReadProbes asked since the last Declare
		hookInFlight  = false
		bcStarted     = map[string]bool{} // hooks whose BeforeCommit was called
		bcOK          = map[string]bool{} // ... and succeeded
		verifierAsked = false
		confirmedAll  = false // every agent answered Confirm ok (attempt 1)
		afterConfirm  = map[string]bool{}
		finalizedAll  = false
		finalizeHooks = map[string]bool{}
	)
	for _, nd := range nodes {
		agents[nd] = &simAgent{}
	}
	preparedOK := map[string]bool{} // delivered Reply OK for prepare
	var queue []Event
	var log []string
	fail := func(msg string, args ...any) {
		t.Helper()
		if violated != nil {
			violated(fmt.Sprintf(msg, args...))
		}
		t.Fatalf("seed %d: "+msg+"\nlog:\n%s\nstate:\n%s", append([]any{seed}, append(args, fmt.Sprint(log), op.String())...)...)
	}
	var declared []Declare
	var handle func(acts []Action)
	handle = func(acts []Action) {
		for _, a := range acts {
			log = append(log, fmt.Sprint(a))
			prevJournal := journaled
			journaled = nil
			if hookInFlight {
				if _, ok := a.(CallHook); ok {
					fail("%s while another hook call is in flight", a)
				}
			}
			switch a := a.(type) {
			case Journal:
				journaled = &a
				if a.Required && r.IntN(10) == 0 {
					// The write fails: as the runner does, feed it back
					// at once and perform what the core answers instead
					// of the rest (the Send it guards).
					log = append(log, "journal write failed")
					handle(op.Step(JournalFailed{Step: a.Step, Attempt: a.Attempt, Err: "injected"}))
					return
				}
			case ResetProbes:
				resetPending = true
				queue = append(queue, ProbesReset{})
			case ReadProbes:
				readProbes = true
				queue = append(queue, ProbesRead{})
			case RunVerifier:
				verifierAsked = true
				var err string
				if r.IntN(8) == 0 {
					err = "mesh broken"
				}
				queue = append(queue, Verified{Err: err})
			case CallHook:
				hookInFlight = true
				// What the agents did, as far as the fed events tell: every
				// one confirmed ok, or answered finalize one way or another
				// (finalize failures do not stop the operation).
				confirmedAll, finalizedAll = true, true
				for _, nd := range nodes {
					h := op.History(nd)
					last := NodeStep{}
					if len(h) > 0 {
						last = h[len(h)-1]
					}
					confirmedAll = confirmedAll && last.Step == Confirm && last.Status == StatusOK
					finalizedAll = finalizedAll && last.Step == Finalize && last.Status != StatusPending
				}
				switch a.Point {
				case HookBeforeCommit:
					bcStarted[a.Hook] = true
					if !a.JournalFirst {
						fail("before-commit hook %s not journaled first", a.Hook)
					}
					if staged && !confirmedAll {
						// The source of truth moves only once every node
						// sends the new port.
						fail("staged: before-commit hook %s before every node confirmed sending the new port", a.Hook)
					}
				case HookAfterConfirm:
					if !confirmedAll {
						fail("after-confirm hook before every agent confirmed")
					}
					if staged && !bcOK[a.Hook] {
						fail("staged: after-confirm hook %s before its before-commit succeeded", a.Hook)
					}
					afterConfirm[a.Hook] = true
				case HookFinalize:
					if !finalizedAll {
						fail("finalize hook before every agent finalized")
					}
					finalizeHooks[a.Hook] = true
				case HookRestore:
					if !bcStarted[a.Hook] {
						fail("restore of %s whose before-commit never started", a.Hook)
					}
				}
				var err string
				if r.IntN(6) == 0 {
					err = "hook " + a.Hook + " " + string(a.Point) + ": injected"
				}
				if err == "" && a.Point == HookBeforeCommit {
					bcOK[a.Hook] = true
				}
				queue = append(queue, HookDone{Hook: a.Hook, Point: a.Point, Err: err})
			case Declare:
				declared = append(declared, a)
				if cfg.Probes && op.CommitSent() && !readProbes {
					fail("declared %v after commit without reading the probes", a.Outcome)
				}
				if a.Outcome == Succeeded {
					for _, h := range cfg.Hooks {
						if !finalizeHooks[h] || !afterConfirm[h] {
							fail("succeeded without hook %s's after-confirm and finalize", h)
						}
					}
				}
				readProbes = false
			case Send:
				if prevJournal == nil || prevJournal.Step != a.Step || prevJournal.Attempt != a.Attempt {
					fail("%s not journaled just before", a)
				}
				if a.Step == Commit {
					if resetPending {
						fail("commit sent before the probe reset ended")
					}
					for _, h := range cfg.Hooks {
						if !bcOK[h] && !staged {
							fail("commit sent before hook %s's before-commit succeeded", h)
						}
					}
				}
				if a.Step == Confirm && cfg.Verifier && !verifierAsked {
					fail("confirm sent before the verifier ran")
				}
				if a.Step == Finalize {
					for _, h := range cfg.Hooks {
						if !afterConfirm[h] {
							fail("finalize sent before hook %s's after-confirm", h)
						}
						if !bcOK[h] {
							fail("finalize sent before hook %s's before-commit succeeded", h)
						}
					}
				}
				if a.After < 0 || (a.After > 0 && a.Step != Abort && a.Step != Rollback && a.Step != Unswitch) ||
					(cfg.RetryBackoffMax > 0 && a.After > cfg.RetryBackoffMax) || (cfg.RetryBackoff == 0 && a.After > 0) {
					fail("pause %s on %s: only abort/rollback retries wait, within the back-off bounds", a.After, a)
				}
				if a.Step == Commit {
					for _, nd := range nodes {
						if !preparedOK[nd] {
							fail("I2: commit sent before %s answered prepared", nd)
						}
					}
				}
				for _, nd := range a.Nodes {
					ag := agents[nd]
					p := failP
					if a.Step == Abort || a.Step == Rollback || a.Step == Unswitch {
						p /= 2
					}
					x := r.Float64()
					effect := x >= p || r.IntN(2) == 0 // failures and timeouts may still have had an effect
					if effect {
						switch a.Step {
						case Prepare:
							ag.prepared = true
						case Commit:
							ag.applied, ag.everApplied = true, true
						case Confirm:
							ag.confirmed = ag.applied
						case Abort, Rollback:
							ag.prepared, ag.applied, ag.confirmed = false, false, false
						case Unswitch:
							ag.applied, ag.confirmed = false, false
							if simUnswitchUnlistens {
								ag.prepared = false
							}
						}
					}
					if staged {
						// The staged invariant: while any node sends the
						// new port, every node receives it.
						for sn, s := range agents {
							for ln, l := range agents {
								if s.applied && !l.prepared {
									fail("staged: %s sends the new port while %s does not listen on it (after %s)", sn, ln, a)
								}
							}
						}
					}
					var ev Event
					switch {
					case x >= p:
						ok := true
						if a.Step == Verify {
							ok = ag.applied
						}
						rep := Reply{Node: nd, Step: a.Step, Attempt: a.Attempt, OK: ok, Err: "x"}
						if a.Step == Commit && r.IntN(8) == 0 {
							// Applied past the budget (when there is one).
							rep.Lateness = 300 * time.Millisecond
						}
						ev = rep
					case x < p/2:
						ev = Reply{Node: nd, Step: a.Step, Attempt: a.Attempt, OK: false, Err: "injected"}
					default:
						ev = Timeout{Node: nd, Step: a.Step, Attempt: a.Attempt}
					}
					queue = append(queue, ev)
					if r.IntN(10) == 0 {
						queue = append(queue, ev) // duplicate
					}
					if a.Step == Commit && r.IntN(8) == 0 {
						// The late timer: before or after the answer (a
						// late node may still have applied, above).
						queue = append(queue, Late{Node: nd, Attempt: a.Attempt})
					}
				}
				if r.IntN(20) == 0 {
					queue = append(queue, Deadline{Step: a.Step, Attempt: a.Attempt})
				}
				if a.Step == Verify && r.IntN(15) == 0 {
					queue = append(queue, StepFailed{Step: Verify, Reason: "mesh"})
				}
			}
		}
	}
	handle(op.Start())
	for steps := 0; len(queue) > 0; steps++ {
		if steps > 10000 {
			fail("no progress")
		}
		if r.IntN(40) == 0 {
			handle(op.Step(RollbackRequested{Reason: "operator"}))
		}
		i := r.IntN(len(queue))
		ev := queue[i]
		queue = slices.Delete(queue, i, i+1)
		if rp, ok := ev.(Reply); ok && rp.Step == Prepare && rp.OK && rp.Attempt == 1 {
			preparedOK[rp.Node] = true
		}
		switch ev.(type) {
		case ProbesReset:
			resetPending = false
		case HookDone:
			hookInFlight = false
		}
		log = append(log, fmt.Sprintf("%T%+v", ev, ev))
		handle(op.Step(ev))
	}
	if op.Outcome() == Pending || len(declared) == 0 {
		fail("queue drained without an outcome")
	}
	last := declared[len(declared)-1]
	if last.Outcome != op.Outcome() {
		fail("declared %v but outcome %v", last.Outcome, op.Outcome())
	}
	for _, nd := range nodes {
		for _, h := range op.History(nd) {
			if h.Status == StatusLate && op.Outcome() != RolledBack && op.Outcome() != Failed {
				fail("%s was late for the commit but the outcome is %v, not a rollback", nd, op.Outcome())
			}
		}
	}
	unreached := map[string]bool{}
	for _, u := range op.Unreached() {
		unreached[u] = true
	}
	for _, nd := range nodes {
		ag := agents[nd]
		switch op.Outcome() {
		case Succeeded:
			if !ag.applied || !ag.confirmed {
				fail("I1: succeeded but %s applied=%t confirmed=%t", nd, ag.applied, ag.confirmed)
			}
		case Aborted:
			if ag.everApplied || ag.prepared {
				fail("aborted but %s everApplied=%t prepared=%t", nd, ag.everApplied, ag.prepared)
			}
		case RolledBack:
			if ag.applied || ag.prepared {
				fail("I1: rolled back but %s applied=%t prepared=%t", nd, ag.applied, ag.prepared)
			}
		case Failed:
			if len(unreached) == 0 {
				fail("failed without naming unreached nodes")
			}
			if staged && op.lastUndo == Unswitch {
				// Nobody was unlistened: only sending is undone.
				if !unreached[nd] && ag.applied {
					fail("failed in unswitch: reached node %s still sends the new port", nd)
				}
				break
			}
			if !unreached[nd] && (ag.applied || ag.prepared) {
				fail("failed: reached node %s still applied=%t prepared=%t", nd, ag.applied, ag.prepared)
			}
		}
	}
	return op.Outcome()
}
