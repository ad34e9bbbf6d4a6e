package lab_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/cutover-dev/cutover/coordinator/cli"
	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/ovs"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// cutoverFigure is one way of changing the port at one lab size.
type cutoverFigure struct {
	Backend      string  `json:"backend"`
	Nodes        int     `json:"nodes"`
	Method       string  `json:"method"` // sequential, parallel, limit, cutover, staged, staged-standing
	IntervalMS   float64 `json:"probe_interval_ms"`
	ProbePeers   int     `json:"probe_peers"` // per node
	Pairs        int     `json:"pairs"`
	Sent         uint64  `json:"probes_sent"`
	Lost         uint64  `json:"probes_lost"`
	MaxPairLost  uint64  `json:"max_lost_per_pair"`
	MeanPairLost float64 `json:"mean_lost_per_pair"`
	LongestGapMS float64 `json:"longest_gap_ms"`
	SpreadMS     float64 `json:"commit_spread_ms"` // cutover: the report's; others: spread of the set completions
	WallMS       float64 `json:"wall_ms"`          // first set started → last set done; cutover: the whole operation
	IdleLost     uint64  `json:"idle_lost_per_s"`  // lost in one idle second before, the noise floor
	// Cutover: the report's spreads of the instants the nodes' writes left
	// (write) and took effect (effect: OVS confirmed, the netlink window
	// closed), where SpreadMS is when the agents woke.
	WriteSpreadMS  float64 `json:"write_spread_ms,omitempty"`
	EffectSpreadMS float64 `json:"effect_spread_ms,omitempty"`
	// LossVsLimit is cutover's (lost+1)/(limit's lost+1) in the same run
	// (OVS; the target: <= 1.5).
	LossVsLimit float64 `json:"loss_vs_limit,omitempty"`
	// LostByPhase (coordctl rows) is the report's lost probes by the
	// phase each was sent in (Report.lost_by_phase; "before" ahead of
	// the first phase): where the loss happened.
	LostByPhase map[string]uint64 `json:"lost_by_phase,omitempty"`
	// LostByGapPhase (coordctl rows) adds each losing pair's lost probes
	// to the phase its longest gap began in: where the pair waited
	// longest, which is not where it lost when its answers were only
	// delayed there (LostByPhase is).
	LostByGapPhase map[string]uint64 `json:"lost_by_worst_gap_phase,omitempty"`
	// IdleLostSameWall (staged) is what the lab lost idling as long as
	// the staged change took, right after it: its noise floor.
	IdleLostSameWall uint64 `json:"idle_lost_same_wall,omitempty"`
	// Warnings (coordctl rows) are the report's warnings the benchmark
	// let pass (coordctlCutover says which).
	Warnings []string `json:"warnings,omitempty"`
}

// envInt and envDur read benchmark knobs (docs/benchmarks.md).
func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

func envDur(k string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

// BenchmarkLabCutover changes the overlay port of whole labs three ways
// and measures the overlay disruption with the agents' probe mesh:
//
//	sequential  the field report's loop: `ovs-vsctl set interface vxlan0
//	            options:dst_port=N` (kernel: recreate flannel.1) one node
//	            after another, after opening the new port on every node
//	            (its step 3), without ssh in between (so it is a best case
//	            of the loop)
//	parallel    the same on every node at once
//	limit       OVS only: the lab's physical limit, every node's prepared
//	            OVSDB transaction released at once from one process
//	cutover     coordctl cutover --port N (prepare, scheduled commit, ...)
//	staged      coordctl cutover --strategy staged --batches 1,50%,100%
//	            (make-before-break: listen on both, switch, retire), from
//	            the cutover's port to a third one
//	staged-standing  OVS only (COT_LAB_BENCH_STANDING=0 leaves it out): the
//	            same from the third port to a fourth, after every agent was
//	            restarted with --ovs-standing-redirects and has put its
//	            redirect flows in place: no flow table change inside the
//	            operation
//
// for N = 8, 16, 32 (COT_LAB_BENCH_SIZES="8,16,32") on both backends
// (COT_LAB_BENCH_BACKENDS="ovs,kernel-vxlan"), probes every
// COT_LAB_BENCH_INTERVAL (1ms) to COT_LAB_BENCH_PEERS peers per node (2; 0
// = all). Writes results/lab_cutover.json and the table in
// docs/benchmarks.md.
func BenchmarkLabCutover(b *testing.B) {
	testenv.RequirePrivileged(b, append(ovsBins, labtest.BuildTools()...)...)
	bin := labtest.Binaries(b)
	interval := envDur("COT_LAB_BENCH_INTERVAL", time.Millisecond)
	peers := envInt("COT_LAB_BENCH_PEERS", 2)
	sizes := strings.Split(envOr("COT_LAB_BENCH_SIZES", "8,16,32"), ",")
	backends := strings.Split(envOr("COT_LAB_BENCH_BACKENDS", lab.BackendOVS+","+lab.BackendKernelVXLAN), ",")
	var figs []cutoverFigure
	for _, backend := range backends {
		for _, s := range sizes {
			n, err := strconv.Atoi(s)
			if err != nil {
				b.Fatalf("COT_LAB_BENCH_SIZES: %q: %v", s, err)
			}
			b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
				for b.Loop() {
					figs = append(figs, benchSize(b, bin, backend, n, interval, peers)...)
				}
			})
		}
	}
	writeCutoverResults(b, figs)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func benchSize(b *testing.B, bin, backend string, n int, interval time.Duration, peers int) []cutoverFigure {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bl := upBenchLab(b, ctx, bin, backend, n, interval, peers)
	defer bl.down()
	l, nodes := bl.l, bl.nodes
	oldPort, newPort, stagedPort := lab.DefaultPort[backend], 4889, 4989
	bl.base.IdleLost = bl.idle(time.Second)
	figs := []cutoverFigure{bl.direct("sequential", false, oldPort, newPort), bl.direct("parallel", true, oldPort, newPort)}
	if backend == lab.BackendOVS {
		lim, _ := bl.limitOVS(oldPort, newPort)
		figs = append(figs, lim)
	}

	cut, _ := bl.coordctl("cutover", "--port", strconv.Itoa(newPort))
	for _, f := range figs {
		if f.Method == "limit" {
			// +1 on both sides: a limit of 0 lost is the usual case at
			// 10 ms, and the ratio must still say something.
			cut.LossVsLimit = float64(cut.Lost+1) / float64(f.Lost+1)
		}
	}
	figs = append(figs, cut)
	// The staged strategy (docs/staged.md), from the new port to a third one: a
	// canary, half, the rest; no instant, so no spread.
	sargs := stagedArgs(stagedPort)
	stg, _ := bl.coordctl("staged", sargs...)
	// A staged change lasts seconds to minutes: the noise floor over one
	// second says little about that long, so the lab idles as long again.
	stg.IdleLostSameWall = bl.idle(time.Duration(stg.WallMS * float64(time.Millisecond)))
	figs = append(figs, stg)
	if backend == lab.BackendOVS && os.Getenv("COT_LAB_BENCH_STANDING") != "0" {
		sargs[1] = strconv.Itoa(stagedPort + 100)
		standing := stagedStanding(b, ctx, l, bin, nodes, stagedPort+100)
		f, srep := bl.coordctl("staged-standing", sargs...)
		f.IdleLostSameWall = bl.idle(time.Duration(f.WallMS * float64(time.Millisecond)))
		standing(time.Duration(srep.GetEndedUnixNano() - srep.GetStartedUnixNano()))
		figs = append(figs, f)
	}
	for _, f := range figs {
		printFigure(f, true)
	}
	return figs
}

// stagedArgs are coordctl's arguments for the staged strategy to port:
// batches 1, 50 %, 100 % (a canary, half, the rest);
// COT_LAB_BENCH_MAX_PARALLEL sets the wave size (default: a tenth of the
// nodes). args[1] is the port.
func stagedArgs(port int) []string {
	args := []string{"--port", strconv.Itoa(port), "--strategy", "staged", "--batches", "1,50%,100%"}
	if k := envInt("COT_LAB_BENCH_MAX_PARALLEL", 0); k > 0 {
		args = append(args, "--max-parallel", strconv.Itoa(k))
	}
	return args
}

// printFigure logs one row on stdout, not through b.Logf: the testing
// package keeps 10 lines of a benchmark's log, and the lab's warnings may
// take them. idleSame: a staged row's IdleLostSameWall was measured.
func printFigure(f cutoverFigure, idleSame bool) {
	extra := ""
	switch f.Method {
	case "staged", "staged-standing":
		if idleSame {
			extra = fmt.Sprintf("; idling as long after it: %d lost", f.IdleLostSameWall)
		}
	case "cutover", "limit":
		extra = fmt.Sprintf("; spreads: writes left %.2f ms, effect %.2f ms", f.WriteSpreadMS, f.EffectSpreadMS)
	}
	for _, w := range f.Warnings {
		extra += "; warning: " + w
	}
	fmt.Printf("    %s N=%d %-10s lost %d/%d (max %d, mean %.2f per pair), longest gap %.1f ms, spread %.2f ms, wall %.0f ms (idle noise %d lost/s)%s%s\n",
		f.Backend, f.Nodes, f.Method, f.Lost, f.Sent, f.MaxPairLost, f.MeanPairLost, f.LongestGapMS, f.SpreadMS, f.WallMS, f.IdleLost, byPhase("lost by phase", f.LostByPhase)+byPhase("lost by worst-gap phase", f.LostByGapPhase), extra)
}

// benchLab is a lab up for a benchmark, with what its ways of changing
// the port share: each starts and ends with the overlay settled.
type benchLab struct {
	b      *testing.B
	ctx    context.Context
	l      *lab.Lab
	bin    string
	nodes  []string
	base   cutoverFigure // the size's fields, and the idle noise when measured
	settle time.Duration // how long a probe may still be answered
	down   func()
}

// upBenchLab brings up a lab of n nodes with the real agents and
// coordinator, warms it up (ARP, first packets) and lets it idle a second.
func upBenchLab(b *testing.B, ctx context.Context, bin, backend string, n int, interval time.Duration, peers int) *benchLab {
	d, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		b.Fatal(err)
	}
	cfg := lab.Config{
		Name: fmt.Sprintf("c%d", os.Getpid()%100000), Nodes: n, Backend: backend, Dir: filepath.Join(d, "lab"),
		StartProcesses: true, AgentBin: filepath.Join(bin, "agent"), CoordinatorBin: filepath.Join(bin, "coordinator"),
		ProbeInterval: interval, ProbePeers: min(peers, n-1),
	}
	// COT_LAB_BENCH_LATE_BUDGET widens the coordinator's lateness budget
	// (and answer deadline, a third more): where 32 nodes share one kernel, their
	// flips queue on its one RTNL lock and a node's Commit answer can come
	// later than the lab's default budget (600 ms, answer 1 s) without anything
	// being wrong with it. The table says which budget it ran with.
	if lb := envDur("COT_LAB_BENCH_LATE_BUDGET", 0); lb > 0 {
		cfg.ExtraCoordinatorArgs = append(cfg.ExtraCoordinatorArgs, "--commit-late-budget", lb.String(), "--commit-answer-deadline", (lb + lb/3).String())
	}
	// Above 16 nodes on this 2-core machine the path check judges clean
	// pairs blocked (docs/pathcheck.md, "Limits"); this benchmark measures
	// the cutover's disruption, so it runs without it there.
	if n > 16 {
		cfg.ExtraCoordinatorArgs = append(cfg.ExtraCoordinatorArgs, "--path-check=false")
	}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		os.RemoveAll(d)
		b.Fatal(err)
	}
	bl := &benchLab{b: b, ctx: ctx, l: l, bin: bin, nodes: names(l),
		settle: l.Config().ProbeTimeout + 100*time.Millisecond,
		base:   cutoverFigure{Backend: backend, Nodes: n, IntervalMS: float64(interval) / 1e6, ProbePeers: len(lab.ProbePeersOf(l.Nodes()[0], l.Nodes(), cfg.ProbePeers))},
	}
	bl.down = func() {
		if err := l.Down(context.Background()); err != nil {
			b.Error(err)
		}
		os.RemoveAll(d)
	}
	// On a saturated machine a pair or two may not answer ICMP in time;
	// the idle figure shows the noise floor either way.
	if m, err := l.Mesh(ctx, 10*time.Second); err != nil || !m.AllOK() {
		b.Logf("warm-up mesh not complete: %v %s", err, failing(m))
	}
	time.Sleep(time.Second)
	return bl
}

// idle is what the lab's probes lost over d with nothing changing.
func (bl *benchLab) idle(d time.Duration) uint64 {
	if _, err := bl.l.ProbeStats(bl.ctx, true); err != nil {
		bl.b.Fatal(err)
	}
	time.Sleep(d)
	p, err := bl.l.ProbeStats(bl.ctx, false)
	if err != nil {
		bl.b.Fatal(err)
	}
	return lab.Summarize(p).Lost
}

// direct is the field report's way from port from to port to, node by
// node (sequential) or on every node at once (parallel), after opening to
// on every node; then every node goes back to from.
func (bl *benchLab) direct(method string, parallel bool, from, to int) cutoverFigure {
	b, ctx, l, nodes := bl.b, bl.ctx, bl.l, bl.nodes
	for _, node := range nodes {
		if err := l.OpenPortDirect(ctx, node, to); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := l.ProbeStats(ctx, true); err != nil {
		b.Fatal(err)
	}
	done := make([]time.Time, len(nodes))
	t0 := time.Now()
	set := func(k int) {
		if err := l.SetPortDirect(ctx, nodes[k], to); err != nil {
			b.Error(err)
		}
		done[k] = time.Now()
	}
	if parallel {
		var wg sync.WaitGroup
		for k := range nodes {
			wg.Go(func() { set(k) })
		}
		wg.Wait()
	} else {
		for k := range nodes {
			set(k)
		}
	}
	wall := time.Since(t0)
	time.Sleep(bl.settle)
	pairs, err := l.ProbeStats(ctx, false)
	if err != nil {
		b.Fatal(err)
	}
	f := figure(bl.base, method, pairs, spreadOf(done), wall)
	restoreDirect(b, ctx, l, nodes, from, to, method)
	return f
}

// coordctl runs coordctl cutover args in the lab as method and returns its
// figure (spread: the report's commit spread, the wake-ups; wall: the
// whole operation) and report, then lets the overlay settle as direct's
// restore does.
func (bl *benchLab) coordctl(method string, args ...string) (cutoverFigure, *coordinatorv1.Report) {
	rep := coordctlCutover(bl.b, bl.ctx, bl.l, bl.bin, args...)
	spread := time.Duration(rep.GetCommitSpreadNanos())
	if rep.GetStrategy() == "staged" {
		spread = 0 // no instant
	}
	f := figure(bl.base, method, reportPairs(rep), spread, time.Duration(rep.GetEndedUnixNano()-rep.GetStartedUnixNano()))
	f.LostByGapPhase = lostByGapPhase(rep)
	for _, l := range rep.GetLostByPhase() {
		if f.LostByPhase == nil {
			f.LostByPhase = map[string]uint64{}
		}
		f.LostByPhase[cmp.Or(l.GetPhase(), "before")] += l.GetLost()
	}
	for _, w := range rep.GetWarnings() {
		if !strings.HasPrefix(w, pathCheckOffWarning) {
			f.Warnings = append(f.Warnings, w)
		}
	}
	if spread > 0 {
		f.WriteSpreadMS = float64(rep.GetWriteSpreadNanos()) / 1e6
		f.EffectSpreadMS = float64(rep.GetEffectSpreadNanos()) / 1e6
	}
	time.Sleep(time.Second)
	return f, rep
}

// spreadOf is the time from the first instant to the last.
func spreadOf(ts []time.Time) time.Duration {
	lo, hi := ts[0], ts[0]
	for _, t := range ts {
		lo, hi = minT(lo, t), maxT(hi, t)
	}
	return hi.Sub(lo)
}

// stagedStanding restarts every node's agent with --ovs-standing-redirects
// and waits until each has put its two redirect flows in place, then lets
// the lab settle (installing them is a flow table change on every node).
// The returned check, given how long the staged operation after it took,
// fails the benchmark unless every node's flows are as old: the operation
// changed none.
func stagedStanding(b *testing.B, ctx context.Context, l *lab.Lab, bin string, nodes []string, port int) func(op time.Duration) {
	for _, node := range nodes {
		if _, err := l.KillAgent(node, syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		if _, err := l.StartAgent(ctx, node, "--ovs-standing-redirects"); err != nil {
			b.Fatal(err)
		}
	}
	if err := waitStandingFlows(ctx, l, nodes, time.Minute); err != nil {
		b.Fatalf("a minute after the agents started with --ovs-standing-redirects: %v", err)
	}
	time.Sleep(5 * time.Second)
	if m, err := l.Mesh(ctx, 10*time.Second); err != nil || !m.AllOK() {
		b.Logf("mesh before staged-standing not complete: %v %s", err, failing(m))
	}
	// 32 agents just restarted: the preflight may find one not ready yet
	// (a run at N = 32 was refused once). A dry run says when it would go.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Second) {
		cmd, err := l.CoordctlCommand(ctx, filepath.Join(bin, "coordctl"), "cutover", "--port", strconv.Itoa(port), "--strategy", "staged", "--dry-run")
		if err != nil {
			b.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err == nil || (errors.As(err, &ee) && ee.ExitCode() == cli.ExitWarnings) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("staged-standing: the dry run still refuses 2 minutes after the agents restarted: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		b.Logf("staged-standing: the dry run refuses (%v), trying again in 5 s; its last line: %s", err, lines[len(lines)-1])
	}
	return func(op time.Duration) {
		if err := standingFlowsOlder(ctx, l, nodes, op); err != nil {
			b.Errorf("after the staged operation (it must change no flow table): %v", err)
		}
	}
}

// limitOVS is the lab's physical limit: one OVSDB connection per
// node opened in advance, the same compare-and-set transaction the agent
// sends prepared on each (ovs.PreparedChange), then released to all nodes
// at once from one process — no gRPC, no clocks, no barrier. Cutover's loss
// is compared with it as a ratio in the same run. Its write and effect
// spreads are those of the transactions' sending and of ovs-vswitchd's
// confirmations (cur_cfg), as the agents report theirs; the durations
// are each node's write to confirmation, in the nodes' order.
func (bl *benchLab) limitOVS(from, to int) (cutoverFigure, []time.Duration) {
	b, ctx, l, nodes := bl.b, bl.ctx, bl.l, bl.nodes
	for _, node := range nodes {
		if err := l.OpenPortDirect(ctx, node, to); err != nil {
			b.Fatal(err)
		}
	}
	changes := make([]ovs.PreparedChange, len(nodes))
	for k, node := range nodes {
		c, err := ovs.New(ovs.Config{Addr: "unix:" + l.OVS(node).DBSock})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if changes[k], err = c.PrepareDstPort(ctx, "vxlan0", uint16(from), uint16(to)); err != nil {
			b.Fatalf("%s: prepare: %v", node, err)
		}
		defer changes[k].Close()
	}
	if _, err := l.ProbeStats(ctx, true); err != nil {
		b.Fatal(err)
	}
	done := make([]time.Time, len(nodes))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range nodes {
		wg.Go(func() {
			<-start
			if _, err := changes[k].Apply(ctx); err != nil {
				b.Errorf("%s: apply: %v", nodes[k], err)
			}
			done[k] = time.Now()
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	time.Sleep(bl.settle)
	pairs, err := l.ProbeStats(ctx, false)
	if err != nil {
		b.Fatal(err)
	}
	f := figure(bl.base, "limit", pairs, spreadOf(done), wall)
	sent, confirmed := make([]time.Time, len(nodes)), make([]time.Time, len(nodes))
	took := make([]time.Duration, len(nodes))
	for k, c := range changes {
		sent[k], confirmed[k] = c.Timing()
		took[k] = confirmed[k].Sub(sent[k])
	}
	f.WriteSpreadMS, f.EffectSpreadMS = float64(spreadOf(sent))/1e6, float64(spreadOf(confirmed))/1e6
	restoreDirect(b, ctx, l, nodes, from, to, "limit")
	return f, took
}

// restoreDirect puts every node back on the old port, closes the opening
// and lets the overlay settle before the next method is measured.
func restoreDirect(b *testing.B, ctx context.Context, l *lab.Lab, nodes []string, oldPort, newPort int, method string) {
	var wg sync.WaitGroup
	for _, node := range nodes {
		wg.Go(func() {
			if err := l.SetPortDirect(ctx, node, oldPort); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	for _, node := range nodes {
		if err := l.ClosePortDirect(ctx, node, newPort); err != nil {
			b.Fatal(err)
		}
	}
	if m, err := l.Mesh(ctx, 10*time.Second); err != nil || !m.AllOK() {
		b.Logf("mesh after %s not complete: %v %s", method, err, failing(m))
	}
	time.Sleep(time.Second)
}

func figure(base cutoverFigure, method string, pairs []lab.PairStats, spread, wall time.Duration) cutoverFigure {
	d := lab.Summarize(pairs)
	f := base
	f.Method, f.Pairs, f.Sent, f.Lost, f.MaxPairLost = method, len(pairs), d.Sent, d.Lost, d.MaxPairLost
	if len(pairs) > 0 {
		f.MeanPairLost = float64(d.Lost) / float64(len(pairs))
	}
	f.LongestGapMS = float64(d.LongestGap) / 1e6
	f.SpreadMS, f.WallMS = float64(spread)/1e6, float64(wall)/1e6
	return f
}

func minT(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// writeCutoverResults writes results/<name>.json and replaces the table
// between the <!-- <name>:begin/end --> markers in docs/benchmarks.md, name
// being COT_LAB_BENCH_NAME (lab_cutover by default): each make target that
// runs this benchmark with other settings names its own file and table, so
// every table in the doc comes from a target that rewrites it.
func writeCutoverResults(b *testing.B, figs []cutoverFigure) {
	name := envOr("COT_LAB_BENCH_NAME", "lab_cutover")
	if !regexp.MustCompile(`^[a-z0-9_]+$`).MatchString(name) {
		b.Fatalf("COT_LAB_BENCH_NAME %q: want [a-z0-9_]+ (a file name and a doc marker)", name)
	}
	marker := strings.ReplaceAll(name, "_", "-")
	tableRE := regexp.MustCompile(`(?s)<!-- ` + marker + `:begin -->.*<!-- ` + marker + `:end -->`)
	benchresult.Save(b, name+".json", figs)
	var t strings.Builder
	t.WriteString("<!-- " + marker + ":begin -->\n")
	load, _ := os.ReadFile("/proc/loadavg")
	budget := "the lab's lateness budget (600 + 400 ms)"
	if lb := envDur("COT_LAB_BENCH_LATE_BUDGET", 0); lb > 0 {
		budget = fmt.Sprintf("a lateness budget of %s + %s", lb, lb/3)
	}
	// The file, not the date, names the run: its provenance says the
	// commit, time and machine, and git keeps the tables it replaced.
	fmt.Fprintf(&t, "`results/%s.json`: %d CPUs, load average at the end %s, %s.\n\n", name, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "), budget)
	t.WriteString("| backend | N | method | probes | lost | max lost/pair | mean lost/pair | longest gap (ms) | spread (ms) | wall (ms) | idle lost/s | loss vs limit |\n")
	t.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range figs {
		vs := ""
		if f.LossVsLimit > 0 {
			vs = fmt.Sprintf("%.2f×", f.LossVsLimit)
		}
		fmt.Fprintf(&t, "| %s | %d | %s | %.0fms × %d peers | %d / %d | %d | %.2f | %.1f | %.2f | %.0f | %d | %s |\n",
			f.Backend, f.Nodes, f.Method, f.IntervalMS, f.ProbePeers, f.Lost, f.Sent, f.MaxPairLost, f.MeanPairLost, f.LongestGapMS, f.SpreadMS, f.WallMS, f.IdleLost, vs)
	}
	t.WriteString("<!-- " + marker + ":end -->")
	p := "../../docs/benchmarks.md"
	doc, err := os.ReadFile(p)
	if err != nil || !tableRE.Match(doc) {
		b.Logf("docs/benchmarks.md has no %s markers; table:\n%s", marker, t.String())
		return
	}
	doc = tableRE.ReplaceAll(doc, []byte(strings.ReplaceAll(t.String(), "$", "$$")))
	if err := os.WriteFile(p, doc, 0o644); err != nil {
		b.Fatal(err)
	}
}

func failing(m lab.Mesh) string {
	var f []string
	for _, line := range strings.Split(m.String(), "\n") {
		if strings.HasSuffix(line, "FAIL") {
			f = append(f, strings.TrimSuffix(line, " FAIL"))
		}
	}
	return strings.Join(f, ", ")
}

// coordctlCutover runs coordctl cutover args -o json in the lab and
// returns its report, which must say SUCCEEDED.
func coordctlCutover(b *testing.B, ctx context.Context, l *lab.Lab, bin string, args ...string) *coordinatorv1.Report {
	cmd, err := l.CoordctlCommand(ctx, filepath.Join(bin, "coordctl"), append(append([]string{"cutover"}, args...), "-o", "json")...)
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.Output()
	// Exit 7 (succeeded with warnings) is expected where the benchmark
	// switched the path check off (N > 16), where the nodes' commits
	// spread over more than --commit-spread-target, and where probe pairs
	// never answered already before the change (32 nodes sharing 2 cores
	// at 1 ms): the spread and the loss are the figures the benchmark
	// records, and the row keeps the warnings.
	var ee *exec.ExitError
	warned := errors.As(err, &ee) && ee.ExitCode() == cli.ExitWarnings
	if err != nil && !warned {
		var stderr []byte
		if ee != nil {
			stderr = ee.Stderr
		}
		b.Fatalf("coordctl cutover %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr)
	}
	rep := &coordinatorv1.Report{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(out, rep); err != nil {
		b.Fatalf("report: %v\n%s", err, out)
	}
	if warned {
		for _, w := range rep.GetWarnings() {
			if !benchWarning(w) {
				b.Fatalf("cutover %s: warning %q", strings.Join(args, " "), w)
			}
		}
	}
	if rep.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		b.Fatalf("cutover %s: %s: %s", strings.Join(args, " "), rep.GetState(), rep.GetError())
	}
	return rep
}

// pathCheckOffWarning begins the report's warning where the benchmark
// switched the path check off (N > 16): expected, so not kept in a row.
const pathCheckOffWarning = "underlay path check off"

// benchWarning says whether a benchmark lets warning w pass
// (coordctlCutover says which and why).
func benchWarning(w string) bool {
	switch {
	case strings.HasPrefix(w, pathCheckOffWarning), strings.HasPrefix(w, "commit spread "):
		return true
	}
	return strings.HasPrefix(w, "probe mesh: ") && strings.Contains(w, "already before the change")
}

// reportPairs is a report's probe figures as the lab's pair statistics.
// lostByGapPhase adds each losing pair's lost probes to the phase its
// longest gap began in ("?" when the report cannot place it).
func lostByGapPhase(rep *coordinatorv1.Report) map[string]uint64 {
	m := map[string]uint64{}
	for _, p := range rep.GetDisruption() {
		if p.GetLost() == 0 {
			continue
		}
		ph := p.GetLongestGapPhase()
		if ph == "" {
			ph = "?"
		}
		m[ph] += p.GetLost()
	}
	return m
}

func byPhase(what string, m map[string]uint64) string {
	if len(m) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return "; " + what + ": " + strings.Join(parts, ", ")
}

func reportPairs(rep *coordinatorv1.Report) []lab.PairStats {
	var pairs []lab.PairStats
	for _, p := range rep.GetDisruption() {
		pairs = append(pairs, lab.PairStats{From: p.GetFrom(), To: p.GetTo(), Sent: p.GetSent(), Lost: p.GetLost(), LongestGap: time.Duration(p.GetLongestGapMicros()) * time.Microsecond})
	}
	return pairs
}
