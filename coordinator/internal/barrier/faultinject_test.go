//go:build cutover_faultinject

package barrier

import (
	"strings"
	"testing"
)

// violation carries what runRandom found broken out of it, so that the
// bite test can tell the broken rule it expects from any other.
type violation string

// The bite tests, built only with the tag cutover_faultinject (the
// switches they set are in faultinject.go). The default build runs each
// of them through a tagged build (faultinject_off_test.go), so plain
// go test ./... runs them too.

// TestStagedInvariantBites: without the unswitch barrier (a staged
// rollback unlistening nodes while others still send the new port), the
// randomized test reports the staged invariant broken.
func TestStagedInvariantBites(t *testing.T) {
	testNoUnswitch = true
	t.Cleanup(func() { testNoUnswitch = false })
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

// TestStagedSubsetBites: without the hold (testNoHold), a subset's run
// retires the old port while untargeted nodes still send it, and the
// invariant check sees it.
func TestStagedSubsetBites(t *testing.T) {
	testNoHold = true
	t.Cleanup(func() { testNoHold = false })
	s := newSubsetSim(t, subsetNodes)
	s.op = New(subsetCfg([][]string{{"n1"}}, nil))
	out := s.run(s.op.Start())
	if out == Held || len(s.broken) == 0 {
		t.Fatalf("the mutation went unseen: outcome %v, %d violations\n%s", out, len(s.broken), s.state())
	}
	t.Logf("mutation caught: %s (and %d more)", s.broken[0], len(s.broken)-1)
}
