package openflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/pkg/openflow"
)

// BenchmarkOps times one ovs-ofctl round trip per operation against a real
// ovs-vswitchd (userspace datapath): AddFlow, DumpFlows (with the bridge's
// few flows) and DelFlows, 30 rounds each, and the pure-Go ParseFlow of a
// dump line for scale. Figures go to $CUTOVER_RESULTS/openflow_ops.json.
func BenchmarkOps(b *testing.B) {
	const rounds = 30
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst := startOVS(b, ctx)
	c := &openflow.Client{RunDir: inst.Dir}
	drop := parse(b, "table=0,priority=200,udp,udp_dst=4789,actions=drop")
	match := openflow.Flow{Match: drop.Match}
	var add, dump, del, parseT []time.Duration
	for range rounds {
		for _, step := range []struct {
			d  *[]time.Duration
			fn func() error
		}{
			{&add, func() error { return c.AddFlow(ctx, "br0", drop) }},
			{&dump, func() error { _, err := c.DumpFlows(ctx, "br0"); return err }},
			{&del, func() error { return c.DelFlows(ctx, "br0", match) }},
		} {
			t0 := time.Now()
			if err := step.fn(); err != nil {
				b.Fatal(err)
			}
			*step.d = append(*step.d, time.Since(t0))
		}
	}
	line := " cookie=0x0, duration=0.101s, table=0, n_packets=0, n_bytes=0, priority=200,udp,tp_dst=4789 actions=drop"
	for range rounds {
		t0 := time.Now()
		for range 1000 {
			if _, err := openflow.ParseFlow(line); err != nil {
				b.Fatal(err)
			}
		}
		parseT = append(parseT, time.Since(t0)/1000)
	}
	res := map[string]any{"rounds": rounds, "addFlow": benchresult.Ms(add), "dumpFlows": benchresult.Ms(dump), "delFlows": benchresult.Ms(del),
		"parseFlowUs": float64(benchresult.Ms(parseT).MedianMs) * 1000}
	b.Logf("AddFlow %.2f ms, DumpFlows %.2f ms, DelFlows %.2f ms (medians of %d ovs-ofctl runs); ParseFlow %.1f µs per line",
		res["addFlow"].(benchresult.MsStats).MedianMs, res["dumpFlows"].(benchresult.MsStats).MedianMs, res["delFlows"].(benchresult.MsStats).MedianMs, rounds, res["parseFlowUs"])
	benchresult.Save(b, "openflow_ops.json", res)
	for i := 0; i < b.N; i++ { // the figures above are the benchmark; b.N is 1 under make bench
	}
}
