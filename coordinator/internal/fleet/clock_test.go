package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc"
)

// slowClock is an agent client whose Clock answers after rtt, counting the
// calls and the most in flight at once. Only Clock is implemented.
type slowClock struct {
	agentv1.AgentServiceClient
	rtt             time.Duration
	calls, inFlight atomic.Int32
	mu              sync.Mutex
	most            int32
}

func (s *slowClock) Clock(ctx context.Context, _ *agentv1.ClockRequest, _ ...grpc.CallOption) (*agentv1.ClockResponse, error) {
	s.calls.Add(1)
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	s.mu.Lock()
	s.most = max(s.most, n)
	s.mu.Unlock()
	select {
	case <-time.After(s.rtt):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &agentv1.ClockResponse{UnixNano: time.Now().UnixNano()}, nil
}

// clockFleet samples as the coordinator does by default (8 samples).
func clockFleet(goodRTT time.Duration, parallel int) *Fleet {
	return &Fleet{clock: Clock{Samples: 8, GoodRTT: goodRTT, Parallel: parallel}, clockSlots: make(chan struct{}, parallel)}
}

// TestClockSamplingStopsAtAGoodRoundTrip: a round trip within
// --clock-good-rtt ends the sampling (its offset error is at most half of
// it); so does a second one near the shortest seen to any agent; without
// either, every --clock-samples sample is taken.
func TestClockSamplingStopsAtAGoodRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		good  time.Duration
		floor time.Duration // the shortest round trip seen before
		want  int32
	}{
		{time.Second, 0, 1},                           // the first 2 ms round trip is good enough
		{time.Microsecond, 0, 2},                      // the second is as good as the first: the network's
		{time.Microsecond, 100 * time.Microsecond, 8}, // another agent answered in 0.1 ms: keep trying
		{0, 0, 8}, // 0: always all
	} {
		c := clockFleet(tc.good, 4)
		c.clockFloor.Store(int64(tc.floor))
		// 20 ms: a quarter of it (5 ms) is above a loaded machine's
		// timer jitter, which the second case depends on.
		cl := &slowClock{rtt: 20 * time.Millisecond}
		s, err := c.MeasureClock(context.Background(), cl)
		if err != nil {
			t.Fatal(err)
		}
		if got := cl.calls.Load(); got != tc.want {
			t.Errorf("--clock-good-rtt %s, shortest before %s: %d Clock calls, want %d", tc.good, tc.floor, got, tc.want)
		}
		if s.RTT < 20*time.Millisecond || s.Offset.Abs() > s.RTT {
			t.Errorf("--clock-good-rtt %s: sample %+v: want an RTT of at least 20ms and an offset within it", tc.good, s)
		}
	}
}

// TestClockSamplingIsBounded: however many agents are sampled at once, no
// more than --clock-parallel Clock calls are in flight, so a round trip
// measures the network rather than the coordinator's own queue; and the
// bound is a bound, not a sequence (they do overlap).
func TestClockSamplingIsBounded(t *testing.T) {
	c := clockFleet(0, 3)
	cl := &slowClock{rtt: 3 * time.Millisecond}
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			if _, err := c.MeasureClock(context.Background(), cl); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if cl.most > 3 || cl.most < 2 {
		t.Errorf("at most %d Clock calls in flight, want 2–3 (--clock-parallel 3, 12 agents)", cl.most)
	}
	if got := cl.calls.Load(); got != 12*int32(c.clock.Samples) {
		t.Errorf("%d Clock calls, want %d", got, 12*c.clock.Samples)
	}
	// A caller whose context ends while waiting for a slot gets an error
	// saying so, not a sample.
	for range 3 {
		c.clockSlots <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.MeasureClock(ctx, cl); err == nil {
		t.Error("no slot free until the deadline: got a sample")
	}
}
