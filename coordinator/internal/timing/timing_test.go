package timing

import (
	"testing"
	"time"
)

// TestCommitLead: the commit lead covers the prepare round's fan-out
// (twice its median answer, at most the round), not the slowest agent's
// own Prepare: one node frozen through it must not push the instant out
// by as long.
func TestCommitLead(t *testing.T) {
	ms := time.Millisecond
	l := Lead{Min: 30 * ms, RTTx: 4}
	for _, tc := range []struct {
		name    string
		round   time.Duration
		answers []time.Duration
		want    time.Duration
	}{
		// The fan-out's estimate, and a quarter more.
		{"one node frozen through prepare", 10700 * ms, []time.Duration{5 * ms, 6 * ms, 10700 * ms}, 30*ms + 15*ms},
		{"answers bunched late", 2300 * ms, []time.Duration{1500 * ms, 1800 * ms, 1900 * ms, 2300 * ms}, 30*ms + 2875*ms},
		{"resumed past prepare: no answers", 800 * ms, nil, 30*ms + 1000*ms},
		{"round trips longer than the round", 2 * ms, []time.Duration{ms, 2 * ms}, 30*ms + 4*2*ms},
	} {
		r := Round{Nodes: 2, MaxRTT: 2 * ms, Prepare: tc.round, Answers: tc.answers}
		if got := CommitLead(l, r); got != tc.want {
			t.Errorf("%s: lead %s, want %s", tc.name, got, tc.want)
		}
	}
	if got := CommitLead(Lead{Min: 30 * ms, RTTx: 4, PerAgent: ms}, Round{Nodes: 100}); got != 130*ms {
		t.Errorf("per-agent allowance: lead %s, want 130ms", got)
	}
}

func TestDeadman(t *testing.T) {
	if got := Deadman(30*time.Second, 5*time.Second); got != 30*time.Second {
		t.Errorf("configured longer: %s", got)
	}
	if got := Deadman(10*time.Second, 5*time.Second); got != 15*time.Second {
		t.Errorf("three steps longer: %s", got)
	}
}
