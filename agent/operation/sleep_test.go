package operation

import (
	"slices"
	"testing"
	"time"
)

// TestPreciseSleepUntil measures how late PreciseSleepUntil returns over 50
// real sleeps. The target is well under a millisecond (typically a few
// microseconds); the assertion is generous because CI machines are noisy.
func TestPreciseSleepUntil(t *testing.T) {
	const n = 50
	lat := make([]time.Duration, 0, n)
	for i := range n {
		at := time.Now().Add(3*time.Millisecond + time.Duration(i%5)*time.Millisecond)
		got := PreciseSleepUntil(at)
		measured := time.Now().Round(0).Sub(at)
		if got < 0 || measured < 0 {
			t.Fatalf("returned before the instant: reported %v, measured %v", got, measured)
		}
		lat = append(lat, got)
	}
	slices.Sort(lat)
	p50, p90, max := lat[n/2], lat[n*9/10], lat[n-1]
	t.Logf("commit lateness over %d sleeps: p50 %v, p90 %v, max %v", n, p50, p90, max)
	if p50 > time.Millisecond {
		t.Fatalf("median lateness %v, want < 1ms (target < 200µs)", p50)
	}
	// A past instant returns at once with the lateness.
	if got := PreciseSleepUntil(time.Now().Add(-time.Second)); got < time.Second {
		t.Fatalf("past instant: lateness %v, want >= 1s", got)
	}
}
