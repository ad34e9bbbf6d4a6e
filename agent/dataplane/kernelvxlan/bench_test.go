package kernelvxlan

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// BenchmarkBackendCommit runs 50 full operations (Snapshot, Prepare, Commit,
// Finalize) through the backend on one node of the two-namespace lab,
// alternating 8472 and 4889, with conntrack cleanup on, and writes
// $CUTOVER_RESULTS/kernel_backend_commit.json: the window pkg/vxlan measured
// inside each Commit (total, absent), the part of Commit before the old
// device is touched (the read and the temporary device's build: what a
// prebuild in Prepare could save), the Commit call itself, and a plain
// device read for scale.
func BenchmarkBackendCommit(b *testing.B) {
	const rounds = 50
	ctx := context.Background()
	a, _ := newLab(b, 8472)
	var window, absent, prepare, cleanup, commit, read []time.Duration
	calls := 0
	us := func(m map[string]string, k string) time.Duration {
		v, err := strconv.ParseInt(m[k], 10, 64)
		if err != nil {
			b.Fatalf("detail %s=%q: %v", k, m[k], err)
		}
		return time.Duration(v) * time.Microsecond
	}
	for i := 0; i < rounds; i++ {
		from, to := tunnelport.Port(8472), tunnelport.Port(4889)
		if i%2 == 1 {
			from, to = to, from
		}
		t0 := time.Now()
		if _, err := a.Kernel.Snapshot(labDev); err != nil {
			b.Fatal(err)
		}
		read = append(read, time.Since(t0))
		s, err := a.b.Snapshot(ctx, from, to)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.b.Prepare(ctx, s); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		st, err := a.b.Commit(ctx, s)
		commit = append(commit, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if st.Detail["strategy"] != "prebuilt" {
			b.Fatalf("round %d: strategy %q", i, st.Detail["strategy"])
		}
		window = append(window, us(st.Detail, "window_us"))
		absent = append(absent, us(st.Detail, "absent_us"))
		prepare = append(prepare, us(st.Detail, "prepare_us"))
		cleanup = append(cleanup, us(st.Detail, "cleanup_us"))
		calls, _ = strconv.Atoi(st.Detail["calls"])
		if err := a.b.Finalize(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	out := map[string]any{
		"rounds": rounds, "fdbEntries": 2, "neighbors": 1, "addrs": 1, "routes": 1, "conntrackCleanup": true,
		"strategy": "prebuilt", "callsInWindow": calls,
		"window":                benchresult.Ms(window),
		"absent":                benchresult.Ms(absent),
		"prebuildInCommit":      benchresult.Ms(prepare),
		"oldDeviceDeleteAfter":  benchresult.Ms(cleanup),
		"commitCall":            benchresult.Ms(commit),
		"deviceRead":            benchresult.Ms(read),
		"note":                  "window/absent: pkg/vxlan Window.Total/Absent inside Commit; prebuildInCommit: building the temporary device before the old one is touched; commitCall includes a device read before, the old device's deletion after the window, conntrack cleanup and the read back",
		"ovsComparisonFile":     "ovs_flip.json",
		"vxlanDriverResultFile": "vxlan_recreate.json",
	}
	ws, ps, cs, rs := benchresult.Ms(window), benchresult.Ms(prepare), benchresult.Ms(commit), benchresult.Ms(read)
	b.Logf("kernel-vxlan Commit: window median %.3f ms p90 %.3f ms max %.3f ms (%d calls); before the window: read %.3f ms + prebuild %.3f ms (median); Commit call median %.3f ms p90 %.3f ms",
		ws.MedianMs, ws.P90Ms, ws.MaxMs, calls, rs.MedianMs, ps.MedianMs, cs.MedianMs, cs.P90Ms)
	benchresult.Save(b, "kernel_backend_commit.json", out)
	for i := 0; i < b.N; i++ { // the figures above are the benchmark; b.N is 1 under make bench
	}
}
