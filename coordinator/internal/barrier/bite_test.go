package barrier

import (
	"strings"
	"testing"
)

// violation carries what runRandom found broken out of it, so that the
// bite test can tell the broken rule it expects from any other.
type violation string

// The bite tests: each breaks one staged rule and shows the check that
// guards it fails (STYLE.md "a safety test must bite"). The core carries
// no switch for them: the simulations the checks run over take the
// mutant's effect instead (an Unswitch that also unlistens, as a Rollback
// sent in its place would; a Held that retires the old port, as a run
// that did not hold would), which is all the checks can see of a mutant
// core.

var (
	// simUnswitchUnlistens: the random simulation's nodes stop listening
	// on the new port at Unswitch.
	simUnswitchUnlistens bool
	// simHeldRetires: the subset simulation retires the old port on every
	// node when the operation declares Held.
	simHeldRetires bool
)

// TestStagedInvariantBites: without the unswitch barrier (a staged
// rollback unlistening nodes while others still send the new port), the
// randomized test reports the staged invariant broken.
func TestStagedInvariantBites(t *testing.T) {
	simUnswitchUnlistens = true
	t.Cleanup(func() { simUnswitchUnlistens = false })
	caught := 0
	for seed := range 300 {
		func() {
			defer func() {
				if v, ok := recover().(violation); ok && strings.Contains(string(v), "does not listen on it") {
					caught++
				} else if ok {
					panic(v)
				}
			}()
			runRandom(t, uint64(seed), func(msg string) { panic(violation(msg)) })
		}()
	}
	if caught == 0 {
		t.Fatal("no seed broke the staged invariant without the unswitch step: the randomized check does not bite")
	}
}

// TestStagedSubsetBites: without the hold (simHeldRetires), a subset's run
// retires the old port while untargeted nodes still send it, and the
// invariant check sees it.
func TestStagedSubsetBites(t *testing.T) {
	simHeldRetires = true
	t.Cleanup(func() { simHeldRetires = false })
	s := newSubsetSim(t, subsetNodes)
	s.op = New(subsetCfg([][]string{{"n1"}}, nil))
	out := s.run(s.op.Start())
	if len(s.broken) == 0 {
		t.Fatalf("the mutation went unseen: outcome %v, %d violations\n%s", out, len(s.broken), s.state())
	}
	t.Logf("mutation caught: %s (and %d more)", s.broken[0], len(s.broken)-1)
}
