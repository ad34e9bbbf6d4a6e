package opstate

import (
	"testing"

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
