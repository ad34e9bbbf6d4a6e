package opstate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func TestPhaseAt(t *testing.T) {
	ph := func(name string, start, d int64) *coordinatorv1.PhaseDuration {
		return &coordinatorv1.PhaseDuration{Phase: name, StartedUnixNano: start, Nanos: d}
	}
	phases := []*coordinatorv1.PhaseDuration{
		ph("preflight", 100, 50), // 100..150, then a gap to 160
		ph("prepare", 160, 40),   // 160..200
		ph("commit", 200, 10),    // 200..210
		ph("verify", 0, 10),      // no start: ignored
	}
	for _, tc := range []struct {
		t    int64
		want string
	}{
		{0, ""}, {99, ""}, {100, "preflight"}, {149, "preflight"},
		{155, "prepare"}, // between two: the next
		{160, "prepare"}, {199, "prepare"}, {200, "commit"},
		{210, "confirm"}, // past all: the one running
	} {
		if got := phaseAt(phases, tc.t, "confirm"); got != tc.want {
			t.Errorf("phaseAt(%d) = %q, want %q", tc.t, got, tc.want)
		}
	}
	if got := phaseAt([]*coordinatorv1.PhaseDuration{ph("commit", 0, 5)}, 10, "x"); got != "" {
		t.Errorf("phases without starts: %q, want none", got)
	}
}

// NoteDisruption counts each lost probe in the phase it was sent in: a
// run's probes spread evenly over its span, so a run across a boundary
// splits, and the report's total adds the pairs up in the phases' order.
func TestNoteDisruptionLostByPhase(t *testing.T) {
	op := New("op1", "cutover", 4789, 4889, []string{"a", "b"}, time.Second, time.Second, 1)
	op.report.Phases = []*coordinatorv1.PhaseDuration{
		{Phase: "prepare", StartedUnixNano: 1000, Nanos: 1000}, // 1000..2000
		{Phase: "commit", StartedUnixNano: 2000, Nanos: 100},   // 2000..2100
	}
	op.CurStep = "verify"
	pair := func(from, to string, lost uint64) *coordinatorv1.PairDisruption {
		return &coordinatorv1.PairDisruption{From: from, To: to, Sent: 100, Lost: lost}
	}
	op.NoteDisruption([]PairRead{
		// 10 probes 1950..2040 ms, 10 apart: 5 in the prepare, 5 in the commit;
		// then one while verify runs.
		{Pair: pair("a", "b", 11), Runs: []LossSpan{{First: 1950, Last: 2040, Count: 10}, {First: 5000, Last: 5000, Count: 1}}},
		// One before the first phase began, one in the commit.
		{Pair: pair("b", "a", 2), Runs: []LossSpan{{First: 500, Last: 500, Count: 1}, {First: 2050, Last: 2050, Count: 1}}},
		{Pair: pair("a", "c", 0)},
		// A run of a billion, as a broken agent might say: placed at
		// maxPlacePoints times 1999/4095 ms apart (2,049 in the prepare,
		// 205 in the commit, 1,842 after), each for 244,140 probes and the
		// first 2,560 for one more, so the count stays whole.
		{Pair: pair("c", "a", 1e9), Runs: []LossSpan{{First: 1000, Last: 2999, Count: 1e9}}},
	}, nil)
	str := func(ls []*coordinatorv1.PhaseLoss) string {
		var out []string
		for _, l := range ls {
			out = append(out, fmt.Sprintf("%s=%d", l.GetPhase(), l.GetLost()))
		}
		return strings.Join(out, " ")
	}
	r := op.report
	for i, want := range []string{"prepare=5 commit=5 verify=1", "=1 commit=1", "", "prepare=500244909 commit=50048905 verify=449706186"} {
		if got := str(r.Disruption[i].LostByPhase); got != want {
			t.Errorf("%s→%s: lost by phase %q, want %q", r.Disruption[i].From, r.Disruption[i].To, got, want)
		}
	}
	if got, want := str(r.LostByPhase), "=1 prepare=500244914 commit=50048911 verify=449706187"; got != want || r.ProbesLost != 1e9+13 {
		t.Errorf("report: lost %d by phase %q, want 1e9+13 as %q", r.ProbesLost, got, want)
	}
}
