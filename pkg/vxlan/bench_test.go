package vxlan_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/pkg/vxlan"
)

type stats struct {
	N        int     `json:"n"`
	MedianMs float64 `json:"medianMs"`
	P90Ms    float64 `json:"p90Ms"`
	MinMs    float64 `json:"minMs"`
	MaxMs    float64 `json:"maxMs"`
}

func summarize(ds []time.Duration) stats {
	if len(ds) == 0 {
		return stats{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return stats{N: len(s), MedianMs: ms(s[len(s)/2]), P90Ms: ms(s[len(s)*9/10]), MinMs: ms(s[0]), MaxMs: ms(s[len(s)-1])}
}

// BenchmarkRecreate recreates the lab's vx0 (2 FDB entries, 1 neighbour, 1
// address, 1 route) 50 times per strategy, alternating 4789 and 4889, and
// writes the windows to $CUTOVER_RESULTS/vxlan_recreate.json. It also times
// the per-entry FDB port rewrite, the alternative for egress only.
func BenchmarkRecreate(b *testing.B) {
	const rounds = 50
	a, _ := newLab(b, 4789)
	out := map[string]any{"rounds": rounds, "fdbEntries": 2, "neighbors": 1, "addrs": 1, "routes": 1}
	for _, strategy := range []string{vxlan.StrategyPrebuilt, vxlan.StrategyDeleteFirst} {
		a.k.Strategy = strategy
		var absent, total, cleanup, prepare []time.Duration
		calls := 0
		for i := 0; i < rounds; i++ {
			snap, err := a.k.Snapshot(dev)
			if err != nil {
				b.Fatal(err)
			}
			port := 4889
			if snap.Device.Port == 4889 {
				port = 4789
			}
			w, err := a.k.Recreate(snap, port)
			if err != nil {
				b.Fatal(err)
			}
			absent, total, cleanup, prepare = append(absent, w.Absent), append(total, w.Total), append(cleanup, w.Cleanup), append(prepare, w.Prepare)
			calls = w.Calls
		}
		res := map[string]any{
			"absent": summarize(absent), "total": summarize(total), "callsInWindow": calls,
			"prepare": summarize(prepare), "cleanupAfterWindow": summarize(cleanup),
		}
		out[strategy] = res
		b.Logf("%-12s window total median %.3f ms p90 %.3f ms max %.3f ms (absent median %.3f ms), %d calls; prepare median %.3f ms; old-device delete after window median %.3f ms",
			strategy, res["total"].(stats).MedianMs, res["total"].(stats).P90Ms, res["total"].(stats).MaxMs, res["absent"].(stats).MedianMs, calls,
			res["prepare"].(stats).MedianMs, res["cleanupAfterWindow"].(stats).MedianMs)
	}
	var fdb []time.Duration
	snap, err := a.k.Snapshot(dev)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < rounds; i++ {
		port := 4999
		if i%2 == 1 {
			port = 0
		}
		t0 := time.Now()
		if err := a.k.SetFDBPorts(snap, port); err != nil {
			b.Fatal(err)
		}
		fdb = append(fdb, time.Since(t0))
	}
	out["setFDBPorts"] = summarize(fdb)
	b.Logf("setFDBPorts  (egress only, 2 entries) median %.3f ms", summarize(fdb).MedianMs)
	writeResults(b, "vxlan_recreate.json", out)
	for i := 0; i < b.N; i++ { // the figures above are the benchmark; b.N is 1 under make bench
	}
}

func writeResults(b *testing.B, name string, v any) {
	dir := os.Getenv("CUTOVER_RESULTS")
	if dir == "" {
		// The repository root: two levels above this package.
		dir = filepath.Join("..", "..", "results")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, append(js, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", p)
}
