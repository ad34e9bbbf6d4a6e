package lab_test

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	"golang.org/x/sys/unix"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's utime and stime: 100
// on every Linux architecture Go supports.
const clockTicks = 100

type footprintFigure struct {
	// "probing": 3 peers every 10 ms, the DaemonSet's rate and sample
	// size (what every agent costs during an operation and for
	// --probe-linger after it, or for good with 3 static --probe-peers);
	// "idle": the DaemonSet's defaults between operations (the mesh on, no
	// static peers: the sample a cutover handed out has lingered out);
	// "off": --probe-listen unset; "probing-1ms": 2 peers every 1 ms, the
	// lab benchmarks' rate (how much of this machine their probes take).
	Probes string `json:"probes"`
	// Agent is whose agent ran: "this" (the tree's) or "base <rev>" (the
	// code before answers rode in probes, built from footprintBase),
	// measured in the same run to compare by ratio; or "mesh floor", whose
	// figures are the mesh floor's nodes' (the agents ran with probes off).
	Agent        string  `json:"agent"`
	Round        int     `json:"round"`
	Nodes        int     `json:"nodes"`
	ProbePeers   int     `json:"probe_peers"`
	IntervalMS   float64 `json:"interval_ms"`
	WindowS      float64 `json:"window_s"`
	RSSMedianMB  float64 `json:"rss_median_mb"`
	RSSMaxMB     float64 `json:"rss_max_mb"`
	CPUMedianPct float64 `json:"cpu_median_pct_of_core"`
	CPUMaxPct    float64 `json:"cpu_max_pct_of_core"`
	// The median of utime (the agent's own code) and of stime (the kernel
	// on its behalf: its syscalls, and on this lab the VXLAN path and the
	// veth peer's receive that its sends run) on their own.
	// CPUSumPct is every agent's together: how much of the machine the
	// lab's agents take at this rate.
	CPUSumPct float64 `json:"cpu_sum_pct_of_core"`
	// WakesPerSecMedian is how often an agent's threads blocked and were
	// woken again (voluntary context switches of every thread, per second;
	// the involuntary ones are the shared cores preempting it): the probe
	// mesh should wake once per tick, not per packet.
	WakesPerSecMedian float64 `json:"wakes_per_s_median"`
	UserMedianPct     float64 `json:"user_median_pct_of_core"`
	SysMedianPct      float64 `json:"sys_median_pct_of_core"`
	// PacketsPerSec is what one probing agent sends (median; the UDP
	// datagrams its node's namespace sent over the window), and as many
	// it receives: its probes, and its answers to its peers' probes that
	// did not ride in one (the sample is symmetric: every peer probes
	// back). KernelPacketPct is what those packets cost
	// the kernel, part of sys: packets/s × the per-packet costs that
	// calibrate measures on the same lab (sending through VXLAN and the
	// veth, whose receive side in the peer's namespace runs on the
	// sender's CPU too, and reading). The rest of sys is the agent's own:
	// its syscalls and wake-ups.
	// RestPct is the CPU less KernelPacketPct: the agent's Go code, the
	// runtime, its wake-ups and the syscalls' own cost.
	// WakeFloorPct is the wake floor's CPU over the same window
	// (wakefloor_priv_test.go): a process woken at the mesh's interval
	// that does nothing else. WakeFloorWakes is its wakes per second.
	WakeFloorPct    float64     `json:"wake_floor_pct_of_core,omitempty"`
	WakeFloorWakes  float64     `json:"wake_floor_wakes_per_s,omitempty"`
	PacketsPerSec   float64     `json:"packets_per_s,omitempty"`
	PacketCost      *packetCost `json:"packet_cost,omitempty"`
	KernelPacketPct float64     `json:"kernel_packet_path_pct_of_core,omitempty"`
	RestPct         float64     `json:"rest_pct_of_core,omitempty"`
	TargetRSSMB     float64     `json:"target_rss_mb"`
	TargetCPUPct    float64     `json:"target_cpu_pct_of_core"`
	SharedCoreNote  string      `json:"note"`
}

// BenchmarkAgentFootprint measures the real agent binary at rest in a lab
// (kernel VXLAN, N=8): resident memory and CPU over a window, with the probe
// mesh probing at the DaemonSet's default rate (3 peers every 10 ms: the
// coordinator's --probe-peers-k and the agent's --probe-interval defaults),
// idle as the DaemonSet's defaults leave it between operations (after a
// cutover whose sample lingered out: --probe-linger is 3 s here instead of
// 10 min, the only change), and with probes off. The targets: RSS <=
// 30 MB, idle CPU <= 0.5 % of a core; probing, <= 1 % at the default rate
// and <= 5 % at 1 ms. The probing rates also run the agent of
// footprintBase, in COT_FOOTPRINT_ROUNDS (3) rounds alternating with this
// tree's, and the file gives this tree's figures over the base's, round by
// round, with their median and range. Each probing round also runs the
// mesh floor (wakefloor_priv_test.go): a process per node that sends the
// agents' datagrams to the same peers at the same rate and does nothing
// else, and the file gives this tree's figures over the floor's too.
// Beside them it measures what this machine charges for a syscall
// (null_syscall_ns), before the rows and after: the mesh makes six a tick,
// and a virtual machine may charge far more for one than bare metal does.
//
// COT_FOOTPRINT_BASE=none runs this tree's agent alone (no Go or git
// needed: the many-core machine, hack/manycore-run.sh);
// COT_FOOTPRINT_PROBES picks the rows (probing,probing-1ms,idle,off);
// COT_FOOTPRINT_NAME names the file (agent_footprint).
// Figures, not a pass/fail: results/agent_footprint.json.
func BenchmarkAgentFootprint(b *testing.B) {
	rev := cmp.Or(os.Getenv("COT_FOOTPRINT_BASE"), footprintBase)
	need := slices.Clone(ovsBins) // appended to: not the shared list's array
	if rev != footprintBaseNone {
		need = append(need, "go", "git") // labtest.AgentAt builds the base
	}
	testenv.RequirePrivileged(b, need...)
	probesRun, err := footprintProbes(os.Getenv("COT_FOOTPRINT_PROBES"))
	if err != nil {
		b.Fatal(err)
	}
	name := cmp.Or(os.Getenv("COT_FOOTPRINT_NAME"), "agent_footprint")
	bin := labtest.Binaries(b)
	window := envDur("COT_FOOTPRINT_WINDOW", 20*time.Second)
	var base, baseName string
	if rev != footprintBaseNone {
		base = labtest.AgentAt(b, rev)
		baseName = "base " + rev[:min(len(rev), 12)]
	}
	rounds := envInt("COT_FOOTPRINT_ROUNDS", 3)
	syscallNS := []float64{nullSyscallNS()}
	var figs []footprintFigure
	// The probing rates run the base agent and this tree's one in
	// alternating rounds, base first: the machine is shared, and only
	// ratios within one run, with their spread over the rounds, say what
	// a change did.
	type row struct {
		probes, agent, bin string
		round              int
	}
	var runs []row
	for _, probes := range probesRun {
		if !strings.HasPrefix(probes, "probing") {
			runs = append(runs, row{probes, "this", filepath.Join(bin, "agent"), 1})
			continue
		}
		for r := 1; r <= rounds; r++ {
			if base != "" {
				runs = append(runs, row{probes, baseName, base, r})
			}
			runs = append(runs, row{probes, "this", filepath.Join(bin, "agent"), r}, row{probes, meshFloorAgent, filepath.Join(bin, "agent"), r})
		}
	}
	for _, r := range runs {
		b.Run(fmt.Sprintf("probes=%s/agent=%s/round=%d", r.probes, strings.Fields(r.agent)[0], r.round), func(b *testing.B) {
			for b.Loop() {
				// The per-packet cost is calibrated once per rate, on
				// this tree's first round.
				f := measureFootprint(b, bin, r.bin, r.agent, r.probes, 8, window, r.agent == "this" && r.round == 1 && strings.HasPrefix(r.probes, "probing"))
				f.Round = r.round
				figs = append(figs, f)
			}
		})
	}
	syscallNS = append(syscallNS, nullSyscallNS())
	b.Logf("a null syscall (getppid) costs %.0f ns before the rows, %.0f ns after", syscallNS[0], syscallNS[1])
	// Every probing row takes the per-packet cost calibrated on its rate,
	// for the packets it sent.
	costs := map[string]*packetCost{}
	for _, f := range figs {
		if f.PacketCost != nil {
			costs[f.Probes] = f.PacketCost
		}
	}
	for i := range figs {
		if c := costs[figs[i].Probes]; c != nil {
			figs[i].KernelPacketPct = 100 * figs[i].PacketsPerSec * (c.SendUS + c.RecvUS) / 1e6
			figs[i].RestPct = figs[i].CPUMedianPct - figs[i].KernelPacketPct
		}
	}
	var ratios, toFloor []footprintRatio
	var summary []footprintSummary
	for _, probes := range []string{"probing", "probing-1ms"} {
		if !slices.Contains(probesRun, probes) {
			continue
		}
		if rr, ok := ratioOf(figs, probes, "this", baseName); ok {
			ratios = append(ratios, rr)
			b.Logf("probes %s: this/base CPU %.2f (%.2f-%.2f over %d rounds), wakes %.2f", probes, rr.CPU, rr.CPUMin, rr.CPUMax, len(rr.CPURounds), rr.Wakes)
		}
		if rr, ok := ratioOf(figs, probes, "this", meshFloorAgent); ok {
			toFloor = append(toFloor, rr)
			b.Logf("probes %s: this/mesh floor CPU %.2f (%.2f-%.2f over %d rounds), wakes %.2f", probes, rr.CPU, rr.CPUMin, rr.CPUMax, len(rr.CPURounds), rr.Wakes)
		}
		for _, agent := range []string{baseName, "this", meshFloorAgent} {
			if agent != "" {
				summary = append(summary, summarize(figs, probes, agent))
			}
		}
	}
	benchresult.Save(b, name+".json", map[string]any{
		"benchmark": name, "cpus": runtime.NumCPU(), "base": rev, "rounds": rounds, "figures": figs,
		"summary": summary, "ratio_this_to_base": ratios, "ratio_this_to_mesh_floor": toFloor, "null_syscall_ns": syscallNS,
	})
}

// ratioOf is agent's figures over other's at a rate, round by round, with
// their median and range; false when other has no rows.
func ratioOf(figs []footprintFigure, probes, agent, other string) (footprintRatio, bool) {
	rr := footprintRatio{Probes: probes}
	var cpu, user, sys, wakes []float64
	for _, f := range figs {
		if f.Probes != probes || f.Agent != agent {
			continue
		}
		for _, g := range figs {
			if g.Probes == probes && g.Agent == other && g.Round == f.Round {
				cpu, user = append(cpu, f.CPUMedianPct/g.CPUMedianPct), append(user, f.UserMedianPct/g.UserMedianPct)
				sys, wakes = append(sys, f.SysMedianPct/g.SysMedianPct), append(wakes, f.WakesPerSecMedian/g.WakesPerSecMedian)
			}
		}
	}
	if len(cpu) == 0 {
		return rr, false
	}
	c := statOf(cpu)
	rr.CPU, rr.User, rr.Sys, rr.Wakes = c.Median, median(user), median(sys), median(wakes)
	rr.CPUMin, rr.CPUMax, rr.CPURounds = c.Min, c.Max, cpu
	return rr, true
}

// footprintBaseNone, as COT_FOOTPRINT_BASE, runs no base agent.
const footprintBaseNone = "none"

// footprintProbes is COT_FOOTPRINT_PROBES's rows, in the benchmark's
// order: every row when it is empty.
func footprintProbes(spec string) ([]string, error) {
	all := []string{"probing", "idle", "off", "probing-1ms"}
	if spec == "" {
		return all, nil
	}
	want := strings.Split(spec, ",")
	for _, p := range want {
		if !slices.Contains(all, p) {
			return nil, fmt.Errorf("COT_FOOTPRINT_PROBES=%q: row %q: want a comma-separated list of %s", spec, p, strings.Join(all, ", "))
		}
	}
	var rows []string
	for _, p := range all {
		if slices.Contains(want, p) {
			rows = append(rows, p)
		}
	}
	return rows, nil
}

// nullSyscallNS is what this machine charges for the cheapest syscall
// (getppid, raw: no scheduler hand-off), in ns: the median of 5 runs of
// 100,000 calls.
func nullSyscallNS() float64 {
	var runs []float64
	for range 5 {
		const n = 100_000
		t0 := time.Now()
		for range n {
			unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
		}
		runs = append(runs, float64(time.Since(t0).Nanoseconds())/n)
	}
	return median(runs)
}

// footprintSummary is one agent's rounds at one probing rate: the median
// of each figure over the rounds, and the CPU's range.
type footprintSummary struct {
	Probes          string  `json:"probes"`
	Agent           string  `json:"agent"`
	Rounds          int     `json:"rounds"`
	CPUMedianPct    float64 `json:"cpu_median_pct_of_core"`
	CPUMinPct       float64 `json:"cpu_min_pct_of_core"`
	CPUMaxPct       float64 `json:"cpu_max_pct_of_core"`
	UserMedianPct   float64 `json:"user_median_pct_of_core"`
	SysMedianPct    float64 `json:"sys_median_pct_of_core"`
	WakesPerSec     float64 `json:"wakes_per_s_median"`
	PacketsPerSec   float64 `json:"packets_per_s"`
	KernelPacketPct float64 `json:"kernel_packet_path_pct_of_core"`
	RestPct         float64 `json:"rest_pct_of_core"`
	WakeFloorPct    float64 `json:"wake_floor_pct_of_core"`
	TargetCPUPct    float64 `json:"target_cpu_pct_of_core"`
}

func summarize(figs []footprintFigure, probes, agent string) footprintSummary {
	var cpu, user, sys, wakes, pps, kernel, rest, floor []float64
	target := 0.0
	for _, f := range figs {
		if f.Probes == probes && f.Agent == agent {
			cpu, user, sys = append(cpu, f.CPUMedianPct), append(user, f.UserMedianPct), append(sys, f.SysMedianPct)
			wakes, pps = append(wakes, f.WakesPerSecMedian), append(pps, f.PacketsPerSec)
			kernel, rest = append(kernel, f.KernelPacketPct), append(rest, f.RestPct)
			floor = append(floor, f.WakeFloorPct)
			target = f.TargetCPUPct
		}
	}
	c := statOf(cpu)
	return footprintSummary{Probes: probes, Agent: agent, Rounds: c.N, CPUMedianPct: c.Median, CPUMinPct: c.Min, CPUMaxPct: c.Max,
		UserMedianPct: median(user), SysMedianPct: median(sys), WakesPerSec: median(wakes), PacketsPerSec: median(pps),
		KernelPacketPct: median(kernel), RestPct: median(rest), WakeFloorPct: median(floor), TargetCPUPct: target}
}

// footprintBase is the last commit whose probe mesh sent every answer
// alone (two datagrams per pair and tick where both probe): the "before"
// the benchmark measures beside this tree (COT_FOOTPRINT_BASE names
// another).
const footprintBase = "9adb119ff44ec1ceeaec810c0403db1b3b72a870"

// footprintRatio is this tree's figures over the base's, per probing
// rate: the median over the rounds of each round's ratio.
type footprintRatio struct {
	Probes string  `json:"probes"`
	CPU    float64 `json:"cpu"`
	User   float64 `json:"user"`
	Sys    float64 `json:"sys"`
	Wakes  float64 `json:"wakes"`
	// CPUMin and CPUMax are the range of the rounds' ratios, CPURounds
	// each round's (this over the base run just before it).
	CPUMin    float64   `json:"cpu_min"`
	CPUMax    float64   `json:"cpu_max"`
	CPURounds []float64 `json:"cpu_rounds"`
}

func measureFootprint(b *testing.B, bin, agentBin, agent, probes string, n int, window time.Duration, calibrateHere bool) footprintFigure {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(d)
	cfg := lab.Config{
		Name: fmt.Sprintf("f%d", os.Getpid()%100000), Nodes: n, Backend: lab.BackendKernelVXLAN, Dir: filepath.Join(d, "lab"),
		StartProcesses: true, AgentBin: agentBin, CoordinatorBin: filepath.Join(bin, "coordinator"),
		ProbeInterval: 10 * time.Millisecond, ProbePeers: 3, NoProbes: probes == "off" || agent == meshFloorAgent,
	}
	if probes == "probing-1ms" {
		cfg.ProbeInterval, cfg.ProbePeers = time.Millisecond, 2
	}
	if probes == "idle" {
		// No static peers (the DaemonSet has none): the coordinator's
		// sample of 3 (--probe-peers-k, from ProbePeers) comes with
		// Prepare and lingers 3 s after the operation.
		cfg.ExtraAgentArgs = []string{"--probe-peers=", "--probe-linger=3s"}
	}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Down(context.Background()); err != nil {
			b.Error(err)
		}
	}()
	var agents []measured
	for _, p := range l.Procs() {
		if p.Role == "agent" {
			agents = append(agents, measured{p.String(), p.PID, p.Alive})
		}
	}
	if len(agents) != n {
		b.Fatalf("%d agents running, want %d", len(agents), n)
	}
	if agent == meshFloorAgent {
		// The agents run with probes off; the mesh floor's nodes probe
		// instead, and are what the row measures.
		agents = startMeshFloor(b, ctx, l, cfg.ProbeInterval, cfg.ProbePeers)
	}
	time.Sleep(3 * time.Second) // start-up allocations and the first probes settle
	if probes == "idle" {
		// A cutover hands every agent its sample (verify passes only if
		// they probed), then each drops it once it lingered out.
		coordctlCutover(b, ctx, l, bin, "--port", "4889")
		waitLog(b, l, "probe peers of the last operation dropped", 30*time.Second)
		time.Sleep(time.Second)
	}
	// The wake floor runs beside every probing row, this tree's and the
	// base's alike (it shares the cores with them).
	var floor *exec.Cmd
	var floorUser0, floorSys0, floorSw0 uint64
	if strings.HasPrefix(probes, "probing") {
		if floor, err = startWakeFloor(cfg.ProbeInterval); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = stopWakeFloor(floor) }()
		time.Sleep(time.Second) // its start-up is not the floor
		floorUser0, floorSys0 = cpuTicks(b, floor.Process.Pid)
		floorSw0 = ctxSwitches(b, floor.Process.Pid)
	}
	user0, sys0, sw0, out0 := make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, p := range agents {
		user0[i], sys0[i] = cpuTicks(b, p.pid)
		sw0[i] = ctxSwitches(b, p.pid)
		out0[i] = udpOut(b, p.pid)
	}
	t0 := time.Now()
	rssMax := make([]float64, n)
	for time.Since(t0) < window {
		for i, p := range agents {
			rssMax[i] = max(rssMax[i], rssMB(b, p.pid))
		}
		time.Sleep(500 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	cpuPct, userPct, sysPct, wakes, pps := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	pct := func(ticks uint64) float64 { return 100 * float64(ticks) / clockTicks / elapsed.Seconds() }
	for i, p := range agents {
		u, st := cpuTicks(b, p.pid)
		userPct[i], sysPct[i] = pct(u-user0[i]), pct(st-sys0[i])
		cpuPct[i] = pct(u - user0[i] + st - sys0[i])
		wakes[i] = float64(ctxSwitches(b, p.pid)-sw0[i]) / elapsed.Seconds()
		pps[i] = float64(udpOut(b, p.pid)-out0[i]) / elapsed.Seconds()
		if !p.alive() {
			b.Fatalf("%s exited during the window", p.name)
		}
	}
	var floorPct, floorWakes float64
	if floor != nil {
		u, st := cpuTicks(b, floor.Process.Pid)
		floorPct = pct(u - floorUser0 + st - floorSys0)
		floorWakes = float64(ctxSwitches(b, floor.Process.Pid)-floorSw0) / elapsed.Seconds()
		if err := stopWakeFloor(floor); err != nil {
			b.Fatalf("wake floor: %v", err)
		}
	}
	// Calibrated once the window's counters are read: its seconds of
	// packets and the agents' ticks meanwhile are not the window's.
	var cost *packetCost
	if calibrateHere {
		c := calibrate(b, l, cfg.ProbeInterval)
		cost = &c
	}
	f := footprintFigure{
		Probes: probes, Agent: agent, Nodes: n, ProbePeers: cfg.ProbePeers, IntervalMS: float64(cfg.ProbeInterval) / 1e6, WindowS: elapsed.Seconds(),
		RSSMedianMB: median(rssMax), RSSMaxMB: maxOf(rssMax), CPUMedianPct: median(cpuPct), CPUMaxPct: maxOf(cpuPct),
		UserMedianPct: median(userPct), SysMedianPct: median(sysPct), CPUSumPct: sum(cpuPct), WakesPerSecMedian: median(wakes),
		WakeFloorPct: floorPct, WakeFloorWakes: floorWakes,
		TargetRSSMB: 30, TargetCPUPct: map[string]float64{"probing": 1, "probing-1ms": 5}[probes],
		SharedCoreNote: fmt.Sprintf("%d agents and their kernels share %d cores; CPU is per agent process (utime+stime)", n, runtime.NumCPU()),
	}
	if f.TargetCPUPct == 0 {
		f.TargetCPUPct = 0.5 // idle, off
	}
	if probes == "off" {
		f.ProbePeers, f.IntervalMS = 0, 0
	}
	if probes == "idle" {
		f.ProbePeers = 0 // between operations
	}
	if f.ProbePeers > 0 {
		f.PacketsPerSec = median(pps)
	}
	if f.ProbePeers > 0 && cost != nil {
		f.PacketCost = cost
		f.KernelPacketPct = 100 * f.PacketsPerSec * (cost.SendUS + cost.RecvUS) / 1e6
		f.RestPct = f.CPUMedianPct - f.KernelPacketPct
	}
	b.Logf("%s agent at rest, probes %s, N=%d, %s window: RSS median %.1f MB max %.1f MB (target <= 30); CPU median %.2f%% max %.2f%% of a core (target <= %.1f%%; user %.2f%%, sys %.2f%% median), all %d agents %.1f%%; %.0f wakes/s median; its packets' kernel path %.2f%%, the rest %.2f%%; the wake floor %.2f%% (%.0f wakes/s)",
		agent, probes, n, elapsed.Round(time.Second), f.RSSMedianMB, f.RSSMaxMB, f.CPUMedianPct, f.CPUMaxPct, f.TargetCPUPct, f.UserMedianPct, f.SysMedianPct, n, f.CPUSumPct, f.WakesPerSecMedian, f.KernelPacketPct, f.RestPct, f.WakeFloorPct, f.WakeFloorWakes)
	return f
}

// waitLog waits up to within until every agent's log has line.
func waitLog(b *testing.B, l *lab.Lab, line string, within time.Duration) {
	deadline := time.Now().Add(within)
	for _, n := range l.Nodes() {
		for {
			data, err := os.ReadFile(filepath.Join(n.Dir, "agent.log"))
			if err == nil && strings.Contains(string(data), line) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: agent.log has no %q after %s (err %v)", n.Name, line, within, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// ctxSwitches is the voluntary context switches of every thread of pid,
// so far.
func ctxSwitches(b *testing.B, pid int) uint64 {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	for _, t := range tasks {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/status")
		if err != nil {
			continue // a thread that ended meanwhile
		}
		for _, l := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if ok && k == "voluntary_ctxt_switches" {
				c, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					b.Fatalf("/proc/%d/task/%s/status %s: %v", pid, t.Name(), k, err)
				}
				n += c
			}
		}
	}
	return n
}

// cpuTicks is utime and stime of pid, in clock ticks.
func cpuTicks(b *testing.B, pid int) (user, sys uint64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// f[0] is field 3; utime and stime are fields 14 and 15.
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return u, st
}

// udpOut is the UDP datagrams sent from pid's network namespace (a lab
// node's: its agent's probes and answers; VXLAN's own datagrams are the
// kernel's and not counted), from /proc/PID/net/snmp.
func udpOut(b *testing.B, pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/snmp")
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "OutDatagrams" && i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					b.Fatalf("/proc/%d/net/snmp OutDatagrams %q: %v", pid, f[i], err)
				}
				return v
			}
		}
	}
	b.Fatalf("/proc/%d/net/snmp: no Udp OutDatagrams", pid)
	return 0
}

// rssMB is VmRSS of pid in MB (10^6 bytes).
func rssMB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatalf("/proc/%d/status VmRSS %q: %v", pid, rest, err)
			}
			return kb * 1024 / 1e6
		}
	}
	b.Fatalf("/proc/%d/status: no VmRSS", pid)
	return 0
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func sum(v []float64) float64 {
	var t float64
	for _, x := range v {
		t += x
	}
	return t
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

// meshFloorAgent is the rows' agent name for the mesh floor
// (wakefloor_priv_test.go): no agent probes, the floor's nodes do.
const meshFloorAgent = "mesh floor"

// measured is a process a row measures: an agent, or a mesh floor node.
type measured struct {
	name  string
	pid   int
	alive func() bool
}

// startMeshFloor starts a mesh floor node in every node's namespace,
// probing the pairs the agents would (lab.ProbePeersOf) every interval,
// and stops them when b ends.
func startMeshFloor(b *testing.B, ctx context.Context, l *lab.Lab, interval time.Duration, k int) []measured {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	nodes := l.Nodes()
	var out []measured
	for _, n := range nodes {
		spec := []string{interval.String(), netip.AddrPortFrom(n.OverlayIP, meshFloorPort).String()}
		for _, p := range lab.ProbePeersOf(n, nodes, k) {
			spec = append(spec, netip.AddrPortFrom(p.OverlayIP, meshFloorPort).String())
		}
		cmd, err := l.Command(ctx, n.Name, self, "-test.run=^$")
		if err != nil {
			b.Fatal(err)
		}
		cmd.Env = append(cmd.Env, meshFloorEnv+"="+strings.Join(spec, ","))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatalf("mesh floor on %s: %v", n.Name, err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		b.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		out = append(out, measured{"mesh floor on " + n.Name, cmd.Process.Pid, func() bool {
			select {
			case <-exited:
				return false
			default:
				return true
			}
		}})
	}
	return out
}
