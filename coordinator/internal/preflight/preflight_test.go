package preflight

import (
	"slices"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
)

func TestSplitProblems(t *testing.T) {
	const d = model.DefaultOverlay
	for _, tc := range []struct {
		name  string
		nodes map[string]overlayNode
		want  []string
	}{
		{"every node targeted", map[string]overlayNode{"n1": {overlay: d, targeted: true}, "n2": {overlay: d, targeted: true}}, nil},
		{"half of one overlay", map[string]overlayNode{
			"n1": {overlay: d, targeted: true, port: 4789}, "n2": {overlay: d, targeted: true, port: 4789},
			"n3": {overlay: d, port: 4789}, "n4": {overlay: d, port: 4789},
		}, []string{"n1,n2 would move to 4889 while n3,n4 stay on 4789: n1,n2 could no longer reach n3,n4 over the overlay; target every node of the overlay"}},
		{"one whole overlay of two", map[string]overlayNode{
			"n1": {overlay: d, targeted: true}, "n2": {overlay: d, targeted: true},
			"n3": {overlay: "blue", port: 4789}, "n4": {overlay: "blue", port: 4789},
		}, nil},
		{"half of a named overlay", map[string]overlayNode{
			"n1": {overlay: d, port: 4789}, "n2": {overlay: "blue", targeted: true, port: 4789}, "n3": {overlay: "blue", port: 4789},
		}, []string{"overlay blue: n2 would move to 4889 while n3 stays on 4789: n2 could no longer reach n3 over the overlay; target every node of the overlay"}},
		{"the rest already on the target: heals a drift", map[string]overlayNode{
			"n1": {overlay: d, targeted: true, port: 4789}, "n2": {overlay: d, port: 4889}, "n3": {overlay: d, port: 4889},
		}, nil},
		{"the rest on two ports", map[string]overlayNode{
			"n1": {overlay: d, targeted: true, port: 4789}, "n2": {overlay: d, port: 4889}, "n3": {overlay: d, port: 4789}, "n4": {overlay: d, port: 4790},
		}, []string{"n1 would move to 4889 while n3 stays on 4789, n4 stays on 4790: n1 could no longer reach n3,n4 over the overlay; target every node of the overlay"}},
		{"the rest unreadable", map[string]overlayNode{
			"n1": {overlay: d, targeted: true, port: 4789}, "n2": {overlay: d, why: "agent at 198.18.0.2:9443 unreachable: down"},
		}, []string{"n1 would move to 4889, but the port of the rest of the overlay could not be read: n2 (agent at 198.18.0.2:9443 unreachable: down); n1 could be cut off from them: bring their agents back, or target every node of the overlay"}},
		{"nothing targeted in an overlay is not its business", map[string]overlayNode{
			"n1": {overlay: d, targeted: true}, "n2": {overlay: "blue", why: "unreachable"},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := splitProblems(tc.nodes, 4889)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n  %q\nwant\n  %q", got, tc.want)
			}
		})
	}
}

// TestPathLead: the path check's start lead follows the measured round of
// calls before it (or three worst round trips), not the node count, and
// stays under the agents' 5 s bound on how far ahead a start may be.
func TestPathLead(t *testing.T) {
	clocks := map[string]fleet.ClockSample{"n1": {RTT: time.Millisecond}, "n2": {RTT: 40 * time.Millisecond}}
	for _, tc := range []struct {
		round time.Duration
		want  time.Duration
	}{
		{20 * time.Millisecond, pathLeadMin + 120*time.Millisecond}, // 3 × the worst RTT
		{800 * time.Millisecond, pathLeadMin + 800*time.Millisecond},
		{30 * time.Second, maxPathLead},
	} {
		if got := pathLead(tc.round, clocks); got != tc.want {
			t.Errorf("round %s: lead %s, want %s", tc.round, got, tc.want)
		}
	}
	if maxPathLead >= 5*time.Second {
		t.Errorf("maxPathLead %s: the agents refuse a start 5s ahead or more", maxPathLead)
	}
}
