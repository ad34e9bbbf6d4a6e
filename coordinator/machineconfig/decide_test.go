package machineconfig

import (
	"errors"
	"slices"
	"testing"
	"time"
)

const (
	oldCfg = "rendered-app-412d73acd12c50adb849543f725dd419"
	newCfg = "rendered-app-c2144a20e3d0e37e96785165ba81f4e8"
)

// TestDecideSeeds001 replays the node annotations of qsu-app-01, a node of
// the field report in docs/machineconfig.md (an SDN-to-OVN migration
// switched half way, the MCC unable to reach the API), in order and checks the step and action at each.
func TestDecideSeeds001(t *testing.T) {
	v := NodeView{Name: "qsu-app-01", Current: oldCfg, Desired: oldCfg, State: StateDone,
		DesiredDrain: UncordonRequest(oldCfg), LastAppliedDrain: UncordonRequest(oldCfg), Ready: true}
	type want struct {
		s Step
		a Action
	}
	var got []want
	check := func() { s, a := Decide(newCfg, v); got = append(got, want{s, a}) }
	check()
	v.Desired = newCfg
	check()
	v.State = StateWorking
	v.DesiredDrain = DrainRequest(newCfg)
	check()
	v.Unschedulable = true
	check() // cordoned, not yet answered: still drain
	v.LastAppliedDrain = DrainRequest(newCfg)
	check()
	v.Ready = false // reboot
	check()
	v.Ready = true
	v.DesiredDrain = UncordonRequest(newCfg)
	check()
	v.Unschedulable = false
	check() // uncordoned, not yet answered
	v.LastAppliedDrain = UncordonRequest(newCfg)
	check()
	v.Current, v.State = newCfg, StateDone
	check()
	exp := []want{
		{StepPending, ActSetDesired},
		{StepWaitDrainRequest, ActWait},
		{StepDrain, ActDrain},
		{StepDrain, ActDrain},
		{StepWaitUncordonRequest, ActWait},
		{StepWaitUncordonRequest, ActWait},
		{StepUncordon, ActUncordon},
		{StepUncordon, ActUncordon},
		{StepWaitCurrent, ActWait},
		{StepDone, ActNone},
	}
	if !slices.Equal(got, exp) {
		t.Fatalf("steps:\n got %v\nwant %v", got, exp)
	}
}

func TestDecideEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    NodeView
		s    Step
		a    Action
	}{
		{"degraded wins over everything", NodeView{Desired: newCfg, Current: newCfg, State: StateDegraded}, StepFailed, ActFail},
		{"unreconcilable", NodeView{Desired: newCfg, State: StateUnreconcilable, DesiredDrain: DrainRequest(newCfg)}, StepFailed, ActFail},
		{"current but still working", NodeView{Desired: newCfg, Current: newCfg, State: StateWorking}, StepWaitDrainRequest, ActWait},
		{"rebootless update needs no drain", NodeView{Desired: newCfg, Current: newCfg, State: StateDone, DesiredDrain: UncordonRequest(oldCfg), LastAppliedDrain: UncordonRequest(oldCfg)}, StepDone, ActNone},
		{"retargeted mid-update", NodeView{Desired: "rendered-app-other", Current: oldCfg, DesiredDrain: DrainRequest("rendered-app-other")}, StepPending, ActSetDesired},
		{"drain request for another config is not ours", NodeView{Desired: newCfg, Current: oldCfg, DesiredDrain: DrainRequest("rendered-app-other")}, StepWaitDrainRequest, ActWait},
		{"empty node", NodeView{}, StepPending, ActSetDesired},
		{"rebootless: Done with the uncordon unanswered", NodeView{Desired: newCfg, Current: newCfg, State: StateDone, DesiredDrain: UncordonRequest(newCfg), LastAppliedDrain: DrainRequest(newCfg), Unschedulable: true}, StepUncordon, ActUncordon},
	} {
		s, a := Decide(newCfg, tc.v)
		if s != tc.s || a != tc.a {
			t.Errorf("%s: got %s/%s, want %s/%s", tc.name, s, a, tc.s, tc.a)
		}
	}
}

func TestOverdue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	to := Timeouts{MCD: time.Minute, Drain: 2 * time.Minute}
	if err := Overdue("n1", StepWaitDrainRequest, t0, t0.Add(59*time.Second), to); err != nil {
		t.Fatalf("under the limit: %v", err)
	}
	err := Overdue("n1", StepWaitDrainRequest, t0, t0.Add(time.Minute), to)
	var te *TimeoutError
	if !errors.As(err, &te) || te.Node != "n1" || te.Step != StepWaitDrainRequest {
		t.Fatalf("at the limit: got %v", err)
	}
	if err := Overdue("n1", StepDrain, t0, t0.Add(90*time.Second), to); err != nil {
		t.Fatalf("drain has its own limit: %v", err)
	}
	if err := Overdue("n1", StepDrain, t0, t0.Add(2*time.Minute), to); err == nil {
		t.Fatal("drain over its limit: no error")
	}
	for _, s := range []Step{StepPending, StepDone, StepFailed, StepUncordon} {
		if err := Overdue("n1", s, t0, t0.Add(time.Hour), to); err != nil {
			t.Errorf("%s never times out: %v", s, err)
		}
	}
}

func TestStart(t *testing.T) {
	done := NodeView{Name: "a", Desired: newCfg, Current: newCfg, State: StateDone, Ready: true}
	pend := func(n string) NodeView {
		return NodeView{Name: n, Current: oldCfg, Desired: oldCfg, State: StateDone, Ready: true}
	}
	working := NodeView{Name: "w", Desired: newCfg, Current: oldCfg, State: StateWorking, Ready: true}
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		max   int
		want  []string
	}{
		{"one at a time", []NodeView{done, pend("b"), pend("c")}, 1, []string{"b"}},
		{"two at a time", []NodeView{done, pend("b"), pend("c"), pend("d")}, 2, []string{"b", "c"}},
		{"busy node uses the slot", []NodeView{working, pend("b")}, 1, nil},
		{"busy node uses one of two", []NodeView{working, pend("b"), pend("c")}, 2, []string{"b"}},
		{"NotReady pending nodes start too (the CNI is down)", []NodeView{{Name: "x", Current: oldCfg, Desired: oldCfg, State: StateDone}, pend("b")}, 1, []string{"x"}},
		{"a failed node stops the rollout", []NodeView{{Name: "f", Desired: newCfg, State: StateDegraded}, pend("b")}, 3, nil},
		{"all done", []NodeView{done}, 1, nil},
	} {
		if got := Start(newCfg, tc.nodes, tc.max); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParseMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		in    string
		nodes int
		want  int
	}{{"1", 5, 1}, {"3", 5, 3}, {"50%", 5, 2}, {"10%", 3, 1}, {"100%", 4, 4}} {
		got, err := ParseMaxUnavailable(tc.in, tc.nodes)
		if err != nil || got != tc.want {
			t.Errorf("%q of %d: got %d, %v; want %d", tc.in, tc.nodes, got, err, tc.want)
		}
	}
	for _, bad := range []string{"0", "0%", "-1", "x", "%", "101%", ""} {
		if _, err := ParseMaxUnavailable(bad, 5); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}
