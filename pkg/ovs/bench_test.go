package ovs

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
)

// BenchmarkFlip measures one node's dst_port change, end to end (sent ->
// ovs-vswitchd applied it (cur_cfg) -> read back), with the native OVSDB
// client and with `ovs-vsctl set interface vxlan0 options:dst_port=N` (which
// also waits for cur_cfg), alternating 4789/4889. It prints median and p99
// and writes $CUTOVER_RESULTS/ovs_flip.json. Figures, not a pass/fail.
func BenchmarkFlip(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipped: needs root to run ovsdb-server/ovs-vswitchd in a network namespace")
	}
	const flips = 200
	ctx := context.Background()
	inst := startOVS(b)
	c, err := New(Config{Addr: "unix:" + inst.DBSock})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		b.Fatal(err)
	}
	ports := [2]uint16{4789, 4889}

	native := make([]time.Duration, 0, flips)
	for n := 0; n < flips; n++ {
		from, to := ports[n%2], ports[(n+1)%2]
		start := time.Now()
		got, err := c.SetDstPort(ctx, "vxlan0", from, to)
		d := time.Since(start)
		if err != nil {
			b.Fatalf("native flip %d %d->%d: %v", n, from, to, err)
		}
		if p, _ := got.DstPort(); p != to {
			b.Fatalf("native flip %d read back %d, want %d", n, p, to)
		}
		native = append(native, d)
	}

	// The same flip prepared ahead (read, transaction, cur_cfg watch built
	// untimed, as the agent does in Prepare), timed from Apply: what a
	// node spends after the commit instant.
	prepared := make([]time.Duration, 0, flips)
	for n := 0; n < flips; n++ {
		from, to := ports[n%2], ports[(n+1)%2]
		p, err := c.PrepareDstPort(ctx, "vxlan0", from, to)
		if err != nil {
			b.Fatalf("prepare flip %d %d->%d: %v", n, from, to, err)
		}
		start := time.Now()
		got, err := p.Apply(ctx)
		d := time.Since(start)
		p.Close()
		if err != nil {
			b.Fatalf("prepared flip %d %d->%d: %v", n, from, to, err)
		}
		if pt, _ := got.DstPort(); pt != to {
			b.Fatalf("prepared flip %d read back %d, want %d", n, pt, to)
		}
		prepared = append(prepared, d)
	}

	execd := make([]time.Duration, 0, flips)
	setOnly := make([]time.Duration, 0, flips)
	for n := 0; n < flips; n++ {
		to := ports[(n+1)%2]
		start := time.Now()
		if _, err := inst.Vsctl(ctx, "set", "interface", "vxlan0", "options:dst_port="+strconv.Itoa(int(to))); err != nil {
			b.Fatal(err)
		}
		setOnly = append(setOnly, time.Since(start))
		// Read back as the native path does, through ovs-vsctl too.
		out, err := inst.Vsctl(ctx, "get", "interface", "vxlan0", "options:dst_port", "ofport", "error")
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		_ = out
		execd = append(execd, d)
	}

	ns, es, ss := benchresult.Summarize(native), benchresult.Summarize(execd), benchresult.Summarize(setOnly)
	nm, np, em, ep, sm, sp := ns.Median, ns.P99, es.Median, es.P99, ss.Median, ss.P99
	ratio := float64(em) / float64(nm)
	ps := benchresult.Summarize(prepared)
	prepRatio := float64(ps.Median) / float64(nm)
	b.Logf("dst_port flip, %d flips each, %d CPUs", flips, runtime.NumCPU())
	b.Logf("  native OVSDB  median %8s  p99 %8s", nm, np)
	b.Logf("  prepared      median %8s  p99 %8s  (Apply only; %.2fx native's median)", ps.Median, ps.P99, prepRatio)
	b.Logf("  ovs-vsctl     median %8s  p99 %8s", em, ep)
	b.Logf("  ovs-vsctl set only (no read-back) median %8s  p99 %8s", sm, sp)
	b.Logf("  exec/native median ratio %.1fx (target >= 5x)", ratio)

	res := map[string]any{
		"benchmark":                "ovs_flip",
		"what":                     "one node's vxlan0 options:dst_port change: sent -> cur_cfg applied -> read back",
		"flips_each":               flips,
		"ports":                    ports,
		"native_median_us":         benchresult.Micros(nm),
		"native_p99_us":            benchresult.Micros(np),
		"prepared_median_us":       benchresult.Micros(ps.Median),
		"prepared_p99_us":          benchresult.Micros(ps.P99),
		"prepared_native_ratio":    prepRatio,
		"vsctl_median_us":          benchresult.Micros(em),
		"vsctl_p99_us":             benchresult.Micros(ep),
		"vsctl_set_only_median_us": benchresult.Micros(sm),
		"vsctl_set_only_p99_us":    benchresult.Micros(sp),
		"exec_native_ratio":        ratio,
		"target_ratio":             5,
		"cpus":                     runtime.NumCPU(),
		"ovs_userspace":            true,
	}
	benchresult.Save(b, "ovs_flip.json", res)
}
