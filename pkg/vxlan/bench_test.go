package vxlan_test

import (
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// BenchmarkRecreate recreates the lab's vx0 (2 FDB entries, 1 neighbour, 1
// address, 1 route) 50 times per strategy, alternating 4789 and 4889, and
// writes the windows to $CUTOVER_RESULTS/vxlan_recreate.json. It also times
// the per-entry FDB port rewrite, the alternative for egress only.
func BenchmarkRecreate(b *testing.B) {
	const rounds = 50
	a, _ := newLab(b, 4789)
	out := map[string]any{"rounds": rounds, "fdbEntries": 2, "neighbors": 1, "addrs": 1, "routes": 1}
	for _, strategy := range []string{vxlan.StrategyPrebuilt, vxlan.StrategyDeleteFirst} {
		a.Kernel.Strategy = strategy
		var absent, total, cleanup, prepare []time.Duration
		calls := 0
		for i := 0; i < rounds; i++ {
			snap, err := a.Kernel.Snapshot(dev)
			if err != nil {
				b.Fatal(err)
			}
			port := 4889
			if snap.Device.Port == 4889 {
				port = 4789
			}
			w, err := a.Kernel.Recreate(snap, port)
			if err != nil {
				b.Fatal(err)
			}
			absent, total, cleanup, prepare = append(absent, w.Absent), append(total, w.Total), append(cleanup, w.Cleanup), append(prepare, w.Prepare)
			calls = w.Calls
		}
		res := map[string]any{
			"absent": benchresult.Ms(absent), "total": benchresult.Ms(total), "callsInWindow": calls,
			"prepare": benchresult.Ms(prepare), "cleanupAfterWindow": benchresult.Ms(cleanup),
		}
		out[strategy] = res
		b.Logf("%-12s window total median %.3f ms p90 %.3f ms max %.3f ms (absent median %.3f ms), %d calls; prepare median %.3f ms; old-device delete after window median %.3f ms",
			strategy, res["total"].(benchresult.MsStats).MedianMs, res["total"].(benchresult.MsStats).P90Ms, res["total"].(benchresult.MsStats).MaxMs, res["absent"].(benchresult.MsStats).MedianMs, calls,
			res["prepare"].(benchresult.MsStats).MedianMs, res["cleanupAfterWindow"].(benchresult.MsStats).MedianMs)
	}
	var fdb []time.Duration
	snap, err := a.Kernel.Snapshot(dev)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < rounds; i++ {
		port := 4999
		if i%2 == 1 {
			port = 0
		}
		t0 := time.Now()
		if err := a.Kernel.SetFDBPorts(snap, port); err != nil {
			b.Fatal(err)
		}
		fdb = append(fdb, time.Since(t0))
	}
	out["setFDBPorts"] = benchresult.Ms(fdb)
	b.Logf("setFDBPorts  (egress only, 2 entries) median %.3f ms", benchresult.Ms(fdb).MedianMs)
	benchresult.Save(b, "vxlan_recreate.json", out)
	for i := 0; i < b.N; i++ { // the figures above are the benchmark; b.N is 1 under make bench
	}
}
