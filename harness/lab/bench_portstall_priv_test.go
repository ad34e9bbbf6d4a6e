package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// portStallRow is what one datapath change on one node cost the lab's
// probe mesh: the node's own pairs (it sends or answers) and the others.
type portStallRow struct {
	Nodes          int     `json:"nodes"`
	Node           string  `json:"node"`
	Op             string  `json:"op"`
	SentNodePairs  uint64  `json:"sent_node_pairs"`
	LostNodePairs  uint64  `json:"lost_node_pairs"`
	LostOtherPairs uint64  `json:"lost_other_pairs"`
	LongestGapMS   float64 `json:"longest_gap_node_pairs_ms"`
	TookMS         float64 `json:"took_ms"` // the ovs-vsctl / ovs-ofctl call
	// VswitchdLog is what the node's ovs-vswitchd logged meanwhile
	// (info and above), at most 8 lines.
	VswitchdLog []string `json:"vswitchd_log,omitempty"`
	// Coverage is what the node's ovs-vswitchd counted meanwhile
	// (coverage/show totals, the change over the row), the 12 largest:
	// which of its code paths the change ran (revalidation, upcalls,
	// flow deletions), beside the idle row's.
	Coverage map[string]int64 `json:"coverage,omitempty"`
}

// coverage reads ovs-vswitchd's coverage totals ("name  …  total: N").
func coverage(ctx context.Context, ovs interface {
	Appctl(context.Context, ...string) (string, error)
}) map[string]int64 {
	out, err := ovs.Appctl(ctx, "coverage/show")
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[len(f)-2] == "total:" {
			if v, err := strconv.ParseInt(f[len(f)-1], 10, 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m
}

// coverageDelta is after minus before, the n largest changes.
func coverageDelta(before, after map[string]int64, n int) map[string]int64 {
	type kv struct {
		k string
		v int64
	}
	var d []kv
	for k, v := range after {
		if v -= before[k]; v > 0 {
			d = append(d, kv{k, v})
		}
	}
	slices.SortFunc(d, func(a, b kv) int { return int(b.v - a.v) })
	out := map[string]int64{}
	for _, e := range d[:min(n, len(d))] {
		out[e.k] = e.v
	}
	return out
}

// BenchmarkOVSPortStall measures, on the OVS lab (userspace datapath, probes
// every 10 ms), what one datapath change on one node alone costs the probe
// mesh, beside an idle hold of the same length: a tunnel port added and
// removed (as the staged strategy's receive port is; no flow uses it here),
// the flow table read, and flows added and removed (one, then 32 in one
// ovs-ofctl run, as the staged strategy's copies are) in a table no packet
// reaches. The
// staged change loses nothing on OVS at N = 8 but thousands of probes at
// N = 32; this says whether a node's port change alone stalls its pairs at
// that size, whatever Cutover does around it. Sizes COT_PORT_STALL_SIZES
// (default "8,32"); four nodes sampled per size. Writes
// results/ovs_port_stall.json.
func BenchmarkOVSPortStall(b *testing.B) {
	testenv.RequirePrivileged(b, append(ovsBins, "go")...)
	bin := labtest.Binaries(b)
	var rows []portStallRow
	for _, s := range strings.Split(envOr("COT_PORT_STALL_SIZES", "8,32"), ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 4 {
			b.Fatalf("COT_PORT_STALL_SIZES: %q: want sizes of at least 4", s)
		}
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for b.Loop() {
				rows = append(rows, portStall(b, bin, n)...)
			}
		})
	}
	load, _ := os.ReadFile("/proc/loadavg")
	benchresult.Save(b, "ovs_port_stall.json", map[string]any{
		"benchmark": "BenchmarkOVSPortStall",
		"setup":     fmt.Sprintf("OVS lab (userspace datapath), probes every 10 ms to 3 peers per node; each change on one node, then a 1.5 s hold; %d CPUs, load average at the end %s", runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " ")),
		"results":   rows,
	})
}

func portStall(b *testing.B, bin string, n int) []portStallRow {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	d, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(d)
	l, err := lab.Up(ctx, lab.Config{
		Name: fmt.Sprintf("s%d", os.Getpid()%100000), Nodes: n, Backend: lab.BackendOVS, Dir: filepath.Join(d, "lab"),
		StartProcesses: true, AgentBin: filepath.Join(bin, "agent"), CoordinatorBin: filepath.Join(bin, "coordinator"),
		ProbeInterval: 10 * time.Millisecond, ProbePeers: 3,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Down(context.Background()); err != nil {
			b.Error(err)
		}
	}()
	nodes := l.Nodes()
	// COT_PORT_STALL_OTHER_CONFIG (key=value,...) sets Open_vSwitch
	// other_config on every node first: which OVS knob the stall follows.
	if oc := os.Getenv("COT_PORT_STALL_OTHER_CONFIG"); oc != "" {
		for _, node := range nodes {
			args := []string{"set", "Open_vSwitch", "."}
			for kv := range strings.SplitSeq(oc, ",") {
				args = append(args, "other_config:"+kv)
			}
			if _, err := l.OVS(node.Name).Vsctl(ctx, args...); err != nil {
				b.Fatalf("%s: %v", node.Name, err)
			}
		}
	}
	if m, err := l.Mesh(ctx, 10*time.Second); err != nil || !m.AllOK() {
		b.Logf("warm-up mesh not complete: %v %s", err, failing(m))
	}
	time.Sleep(time.Second)
	const hold = 1500 * time.Millisecond
	var rows []portStallRow
	for k := 0; k < 4; k++ {
		node := nodes[k*n/4]
		ovs := l.OVS(node.Name)
		port := []string{"add-port", "br0", "cotstall", "--", "set", "interface", "cotstall", "type=vxlan",
			"options:remote_ip=flow", "options:key=flow", "options:dst_port=4999", "options:local_ip=" + node.UnderlayIP.String()}
		var flows strings.Builder
		for i := range 32 {
			fmt.Fprintf(&flows, "table=253,priority=%d,cookie=0x5747,ip,nw_dst=198.19.254.%d,actions=drop\n", 10+i, i)
		}
		flowFile := filepath.Join(d, "flows")
		if err := os.WriteFile(flowFile, []byte(flows.String()), 0o644); err != nil {
			b.Fatal(err)
		}
		for _, op := range []struct {
			name string
			do   func() error
		}{
			{"idle", func() error { return nil }},
			{"add tunnel port", func() error { _, err := ovs.Vsctl(ctx, port...); return err }},
			{"dump flows", func() error { _, err := ovs.Ofctl(ctx, "-O", "OpenFlow13", "dump-flows", "br0"); return err }},
			{"add 1 flow", func() error {
				_, err := ovs.Ofctl(ctx, "-O", "OpenFlow13", "add-flow", "br0", "table=253,priority=5,cookie=0x5748,ip,nw_dst=198.19.253.1,actions=drop")
				return err
			}},
			{"delete 1 flow", func() error {
				_, err := ovs.Ofctl(ctx, "-O", "OpenFlow13", "del-flows", "br0", "cookie=0x5748/-1")
				return err
			}},
			{"add 32 flows", func() error { _, err := ovs.Ofctl(ctx, "-O", "OpenFlow13", "add-flows", "br0", flowFile); return err }},
			{"delete the flows", func() error {
				_, err := ovs.Ofctl(ctx, "-O", "OpenFlow13", "del-flows", "br0", "cookie=0x5747/-1")
				return err
			}},
			{"delete tunnel port", func() error { _, err := ovs.Vsctl(ctx, "del-port", "br0", "cotstall"); return err }},
		} {
			if _, err := l.ProbeStats(ctx, true); err != nil {
				b.Fatal(err)
			}
			logFile := filepath.Join(ovs.Dir, "ovs-vswitchd.log")
			var logFrom int64
			if st, err := os.Stat(logFile); err == nil {
				logFrom = st.Size()
			}
			cov := coverage(ctx, ovs)
			t0 := time.Now()
			if err := op.do(); err != nil {
				b.Fatalf("%s %s: %v", node.Name, op.name, err)
			}
			took := time.Since(t0)
			time.Sleep(hold - took)
			covAfter := coverage(ctx, ovs)
			pairs, err := l.ProbeStats(ctx, false)
			if err != nil {
				b.Fatal(err)
			}
			r := portStallRow{Nodes: n, Node: node.Name, Op: op.name, TookMS: float64(took) / 1e6, Coverage: coverageDelta(cov, covAfter, 12)}
			if data, err := os.ReadFile(logFile); err == nil && int64(len(data)) > logFrom {
				for line := range strings.Lines(string(data[logFrom:])) {
					if len(r.VswitchdLog) < 8 {
						r.VswitchdLog = append(r.VswitchdLog, strings.TrimSpace(line))
					}
				}
			}
			for _, p := range pairs {
				if p.From == node.Name || p.To == node.Name {
					r.SentNodePairs += p.Sent
					r.LostNodePairs += p.Lost
					r.LongestGapMS = max(r.LongestGapMS, float64(p.LongestGap)/1e6)
				} else {
					r.LostOtherPairs += p.Lost
				}
			}
			rows = append(rows, r)
		}
	}
	for _, op := range []string{"idle", "add tunnel port", "dump flows", "add 1 flow", "delete 1 flow", "add 32 flows", "delete the flows", "delete tunnel port"} {
		var node, other, gaps []float64
		for _, r := range rows {
			if r.Op == op {
				node, other, gaps = append(node, float64(r.LostNodePairs)), append(other, float64(r.LostOtherPairs)), append(gaps, r.LongestGapMS)
			}
		}
		b.Logf("N=%d %-18s lost on the node's pairs %v (others' %v), longest gap on its pairs %v ms", n, op, node, other, roundAll(gaps))
	}
	return rows
}

func roundAll(v []float64) []float64 {
	out := slices.Clone(v)
	for i := range out {
		out[i] = float64(int(out[i]*10+0.5)) / 10
	}
	return out
}
