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
		counts[runRandom(t, uint64(seed))]++
	}
	t.Logf("outcomes over %d seeds: %v", seeds, counts)
	for _, o := range []Outcome{Succeeded, Aborted, RolledBack, Failed} {
		if counts[o] == 0 {
			t.Errorf("no seed ended %v: the generator does not explore it", o)
		}
	}
}

func runRandom(t *testing.T, seed uint64) Outcome {
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
	op := New(cfg)
	agents := map[string]*simAgent{}
	for _, nd := range nodes {
		agents[nd] = &simAgent{}
	}
	preparedOK := map[string]bool{} // delivered Reply OK for prepare
	var queue []Event
	var log []string
	fail := func(msg string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+msg+"\nlog:\n%s\nstate:\n%s", append([]any{seed}, append(args, fmt.Sprint(log), op.String())...)...)
	}
	var declared []Declare
	handle := func(acts []Action) {
		for _, a := range acts {
			log = append(log, fmt.Sprint(a))
			switch a := a.(type) {
			case Declare:
				declared = append(declared, a)
			case Send:
				if a.After < 0 || (a.After > 0 && a.Step != Abort && a.Step != Rollback) ||
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
					if a.Step == Abort || a.Step == Rollback {
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
						}
					}
					var ev Event
					switch {
					case x >= p:
						ok := true
						if a.Step == Verify {
							ok = ag.applied
						}
						ev = Reply{Node: nd, Step: a.Step, Attempt: a.Attempt, OK: ok, Err: "x"}
					case x < p/2:
						ev = Reply{Node: nd, Step: a.Step, Attempt: a.Attempt, OK: false, Err: "injected"}
					default:
						ev = Timeout{Node: nd, Step: a.Step, Attempt: a.Attempt}
					}
					queue = append(queue, ev)
					if r.IntN(10) == 0 {
						queue = append(queue, ev) // duplicate
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
			if !unreached[nd] && (ag.applied || ag.prepared) {
				fail("failed: reached node %s still applied=%t prepared=%t", nd, ag.applied, ag.prepared)
			}
		}
	}
	return op.Outcome()
}
