package barrier

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// subsetSim is a dataplane model for staged subsets: what each node
// receives and sends, changed as every Send is answered ok, with the
// staged invariant (every node receives every port any node sends on)
// checked after each step.
type subsetSim struct {
	t      *testing.T
	op     *Op
	rx     map[string]map[string]bool // node → ports ("old", "new") it receives
	send   map[string]string
	broken []string
	log    []string
	fail   map[Step]string // a step that fails on one node
}

func newSubsetSim(t *testing.T, nodes []string) *subsetSim {
	s := &subsetSim{t: t, rx: map[string]map[string]bool{}, send: map[string]string{}, fail: map[Step]string{}}
	for _, n := range nodes {
		s.rx[n] = map[string]bool{"old": true}
		s.send[n] = "old"
	}
	return s
}

// run feeds acts and everything they cause until the operation declares.
func (s *subsetSim) run(acts []Action) Outcome {
	queue := acts
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		s.log = append(s.log, fmt.Sprint(a))
		var evs []Event
		switch a := a.(type) {
		case Send:
			for _, n := range a.Nodes {
				if s.fail[a.Step] == n {
					evs = append(evs, Reply{Node: n, Step: a.Step, Attempt: a.Attempt, Err: "injected"})
					continue
				}
				switch a.Step {
				case Prepare:
					s.rx[n]["new"] = true
				case Commit:
					s.send[n] = "new"
				case Unswitch:
					s.send[n] = "old"
				case Abort, Rollback:
					s.send[n] = "old"
					delete(s.rx[n], "new")
				case Finalize:
					s.rx[n] = map[string]bool{"new": true}
					s.send[n] = "new"
				}
				s.check(fmt.Sprintf("%s on %s", a.Step, n))
				evs = append(evs, Reply{Node: n, Step: a.Step, Attempt: a.Attempt, OK: true})
			}
		case ResetProbes:
			evs = append(evs, ProbesReset{})
		case ReadProbes:
			evs = append(evs, ProbesRead{})
		case RunVerifier:
			evs = append(evs, Verified{})
		case CallHook:
			evs = append(evs, HookDone{Hook: a.Hook, Point: a.Point})
		case Declare:
			if a.Outcome == Held && simHeldRetires {
				for _, n := range slices.Sorted(maps.Keys(s.send)) {
					s.rx[n] = map[string]bool{"new": true}
					s.send[n] = "new"
					s.check("finalize on " + n + " (the mutant retires instead of holding)")
				}
			}
			return a.Outcome
		}
		for _, ev := range evs {
			queue = append(queue, s.op.Step(ev)...)
		}
	}
	s.t.Fatalf("no outcome declared:\n%s", strings.Join(s.log, "\n"))
	return Pending
}

func (s *subsetSim) check(after string) {
	for a, p := range s.send {
		for b, rx := range s.rx {
			if !rx[p] {
				s.broken = append(s.broken, fmt.Sprintf("after %s: %s sends %s, %s receives only %v", after, a, p, b, slices.Sorted(maps.Keys(rx))))
			}
		}
	}
}

func (s *subsetSim) state() string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(s.send)) {
		out = append(out, fmt.Sprintf("%s:rx=%v,tx=%s", n, slices.Sorted(maps.Keys(s.rx[n])), s.send[n]))
	}
	return strings.Join(out, " ")
}

var subsetNodes = []string{"n1", "n2", "n3", "n4"}

func subsetCfg(batches [][]string, switched []string) Config {
	return Config{Nodes: subsetNodes, StepTimeout: time.Second, Verifier: true, Probes: true, Hooks: []string{"h"}, Batches: batches, Switched: switched}
}

// TestStagedSubsetHoldsThenRetires: a run over n1,n2 of four nodes holds
// (every node listening, n1,n2 sending the new port, nothing retired),
// then a continuation switches n3, n4 and retires the old port.
func TestStagedSubsetHoldsThenRetires(t *testing.T) {
	s := newSubsetSim(t, subsetNodes)
	s.op = New(subsetCfg([][]string{{"n1"}, {"n2"}}, nil))
	if out := s.run(s.op.Start()); out != Held {
		t.Fatalf("first run: %v, want held\n%s", out, strings.Join(s.log, "\n"))
	}
	if got, want := s.state(), "n1:rx=[new old],tx=new n2:rx=[new old],tx=new n3:rx=[new old],tx=old n4:rx=[new old],tx=old"; got != want {
		t.Fatalf("held: %s\nwant %s", got, want)
	}
	if got := s.op.Sending(); fmt.Sprint(got) != "[n1 n2]" {
		t.Errorf("Sending() = %v", got)
	}
	for _, l := range s.log {
		if strings.Contains(l, "finalize") {
			t.Errorf("a held run called %s", l)
		}
	}
	// The next run: n3, then n4; Prepare replays, then the rest switch
	// and every node retires the old port.
	s.op = New(subsetCfg([][]string{{"n3"}, {"n4"}}, []string{"n1", "n2"}))
	s.log = nil
	acts := s.op.Start()
	if j, ok := acts[0].(Journal); !ok || j.Step != Prepare || !j.CommitSent {
		// A restart during the replayed prepare must undo with Unswitch
		// first: the journal says commit was sent from the first step.
		t.Fatalf("the continuation's first action %v: want the prepare journaled with commit-sent", acts[0])
	}
	if out := s.run(acts); out != Succeeded {
		t.Fatalf("continuation: %v, want succeeded\n%s", out, strings.Join(s.log, "\n"))
	}
	if got, want := s.state(), "n1:rx=[new],tx=new n2:rx=[new],tx=new n3:rx=[new],tx=new n4:rx=[new],tx=new"; got != want {
		t.Fatalf("after the continuation: %s\nwant %s", got, want)
	}
	if len(s.broken) > 0 {
		t.Fatalf("invariant broken:\n%s", strings.Join(s.broken, "\n"))
	}
}

// TestStagedSubsetUndo: a held operation rolled back, and a continuation
// that fails (in its replayed prepare, and in a batch) undo every node,
// the earlier runs' switched ones included, senders first.
func TestStagedSubsetUndo(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail Step // in the continuation, on n3 ("" : rollback the held one)
		want Outcome
	}{
		{"rollback held", "", RolledBack},
		{"continuation prepare fails", Prepare, RolledBack},
		{"continuation batch fails", Commit, RolledBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSubsetSim(t, subsetNodes)
			s.op = New(subsetCfg([][]string{{"n1", "n2"}}, nil))
			if out := s.run(s.op.Start()); out != Held {
				t.Fatalf("first run: %v", out)
			}
			var out Outcome
			if tc.fail == "" {
				out = s.run(s.op.Step(RollbackRequested{Reason: "operator"}))
			} else {
				s.fail[tc.fail] = "n3"
				s.op = New(subsetCfg([][]string{{"n3"}, {"n4"}}, []string{"n1", "n2"}))
				out = s.run(s.op.Start())
			}
			if out != tc.want {
				t.Fatalf("%v, want %v\n%s", out, tc.want, strings.Join(s.log, "\n"))
			}
			for n, p := range s.send {
				if p != "old" || len(s.rx[n]) != 1 || !s.rx[n]["old"] {
					t.Errorf("%s not back on the old port: %s", n, s.state())
				}
			}
			if len(s.broken) > 0 {
				t.Fatalf("invariant broken:\n%s", strings.Join(s.broken, "\n"))
			}
		})
	}
}
