package agent

import (
	"context"
	"log/slog"
	"time"
)

// The coordinator hands each agent a probe sample with Prepare. Kept for
// ever, an agent that ran one cutover would probe its peers at the
// operation's rate for good: 3 peers every 10 ms cost an 8-node lab's
// agents 5.7 % of a core each against 0.05 % without peers (make
// bench-agent), and put ~1,200 packets a second on the overlay. So the
// sample lingers --probe-linger after the operation ended (the coordinator
// reads the counters within seconds of the end), then the mesh goes back to
// the --probe-peers it started with (usually none: idle).

// lingerProbes runs until ctx ends, checking every every.
func (s *Service) lingerProbes(ctx context.Context, linger, every time.Duration, log *slog.Logger) {
	if s.probes == nil || linger <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.dropLingeringPeers(linger) {
			log.Info("probe peers of the last operation dropped", "after", linger, "peers", len(s.probes.static))
		}
	}
}

// dropLingeringPeers puts the static peers back once the coordinator's have
// outlived the operation by linger. It reports whether it did.
func (s *Service) dropLingeringPeers(linger time.Duration) bool {
	if !s.probes.coordPeers.Load() {
		return false
	}
	m, _, err := s.core()
	if err != nil {
		return false
	}
	rec, err := m.Status("")
	if err != nil || rec.Phase.InFlight() {
		return false
	}
	ended := rec.Ended
	if ended.IsZero() {
		ended = rec.Updated
	}
	if s.clock.Now().Sub(ended) < linger {
		return false
	}
	// The peers were checked when the agent started: this cannot fail.
	return s.probes.backToStatic() == nil
}
