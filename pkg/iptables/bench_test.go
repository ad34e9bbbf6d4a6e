package iptables_test

import (
	"context"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/pkg/iptables"
)

// BenchmarkOps times what prepare and finalize cost per node on each
// backend, in a fresh netns: backend detection, EnsureRule when absent
// (-C then -A), EnsureRule when present (-C only) and DeleteRule (-C then
// -D); 30 rounds each. Figures go to $CUTOVER_RESULTS/iptables_ops.json.
func BenchmarkOps(b *testing.B) {
	const rounds = 30
	out := map[string]any{"rounds": rounds}
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		requireBackend(b, backend)
		ns := newNS(b)
		var detect, add, again, del []time.Duration
		in(b, ns, func() error {
			ctx := context.Background()
			for range rounds {
				t0 := time.Now()
				if _, err := iptables.Detect(ctx, nil); err != nil {
					return err
				}
				detect = append(detect, time.Since(t0))
			}
			c, err := iptables.New(ctx, iptables.Config{Backend: backend})
			if err != nil {
				return err
			}
			if err := c.EnsureChain("filter", iptables.DefaultChain); err != nil {
				return err
			}
			r := iptables.Rule{Table: "filter", Chain: iptables.DefaultChain, Proto: "udp", DPort: 4889, StateNew: true, Target: "ACCEPT"}
			for range rounds {
				for _, step := range []struct {
					d  *[]time.Duration
					fn func(iptables.Rule) error
				}{{&add, c.EnsureRule}, {&again, c.EnsureRule}, {&del, c.DeleteRule}} {
					t0 := time.Now()
					if err := step.fn(r); err != nil {
						return err
					}
					*step.d = append(*step.d, time.Since(t0))
				}
			}
			return nil
		})
		res := map[string]benchresult.MsStats{"detect": benchresult.Ms(detect), "ensureAbsent": benchresult.Ms(add), "ensurePresent": benchresult.Ms(again), "delete": benchresult.Ms(del)}
		out[backend] = res
		b.Logf("%-6s detect %.2f ms, EnsureRule absent %.2f ms / present %.2f ms, DeleteRule %.2f ms (medians of %d)",
			backend, res["detect"].MedianMs, res["ensureAbsent"].MedianMs, res["ensurePresent"].MedianMs, res["delete"].MedianMs, rounds)
	}
	benchresult.Save(b, "iptables_ops.json", out)
	for i := 0; i < b.N; i++ { // the figures above are the benchmark; b.N is 1 under make bench
	}
}
