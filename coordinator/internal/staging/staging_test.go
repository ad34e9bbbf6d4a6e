package staging

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestPlanBatches(t *testing.T) {
	nodes := func(n int) []string {
		var ns []string
		for i := range n {
			ns = append(ns, fmt.Sprintf("n%02d", i))
		}
		return ns
	}
	for _, tc := range []struct {
		specs []string
		n     int
		want  string
	}{
		{nil, 1, "[n00]"},
		{nil, 3, "[n00] [n01 n02]"},
		{[]string{"1", "10%", "100%"}, 3, "[n00] [n01 n02]"}, // 10% of 3 rounds up to 1: skipped
		{[]string{"1", "10%", "100%"}, 20, "[n00] [n01] [n02 n03 n04 n05 n06 n07 n08 n09 n10 n11 n12 n13 n14 n15 n16 n17 n18 n19]"},
		{[]string{"50%", "100%"}, 4, "[n00 n01] [n02 n03]"},
		{[]string{"100%"}, 2, "[n00 n01]"},
		{[]string{"2", "4"}, 4, "[n00 n01] [n02 n03]"},
	} {
		bs, err := PlanBatches(tc.specs, nodes(tc.n))
		if err != nil {
			t.Fatalf("%v of %d: %v", tc.specs, tc.n, err)
		}
		var got []string
		for _, b := range bs {
			got = append(got, fmt.Sprint(b))
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%v of %d: %s, want %s", tc.specs, tc.n, g, tc.want)
		}
	}
}

func TestWaveSize(t *testing.T) {
	for _, tc := range []struct{ req, n, want, waves int }{
		{0, 1, 1, 1}, {0, 8, 1, 8}, {0, 10, 1, 10}, {0, 11, 2, 6}, {0, 32, 4, 8}, {0, 10000, 1000, 10},
		{3, 8, 3, 3}, {20, 8, 8, 1}, {1, 8, 1, 8},
	} {
		k := WaveSize(tc.req, tc.n)
		if k != tc.want || Waves(tc.n, k) != tc.waves {
			t.Errorf("WaveSize(%d, %d) = %d (%d waves), want %d (%d waves)", tc.req, tc.n, k, Waves(tc.n, k), tc.want, tc.waves)
		}
	}
}

// TestBounds: a staged step in waves lasts as long as its waves, and a
// first-wave node's dead-man waits for the others.
func TestBounds(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		n, k                  int
		wantBound, wantDeadms time.Duration
	}{
		{10, 0, 2 * s, 30 * s},  // no wave limit
		{10, 10, 2 * s, 30 * s}, // one wave
		{10, 3, 8 * s, 36 * s},  // four waves
	} {
		b, d := Bounds(tc.n, tc.k, 2*s, 30*s)
		if b != tc.wantBound || d != tc.wantDeadms {
			t.Errorf("n=%d k=%d: bound %s deadman %s, want %s %s", tc.n, tc.k, b, d, tc.wantBound, tc.wantDeadms)
		}
	}
}
