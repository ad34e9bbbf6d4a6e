package lab_test

import (
	"context"
	"fmt"
	"math"
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
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The meter agreement check ("a meter that tells the truth"): the
// agents' probe mesh and an independent UDP echo ring (lab.EchoRing) over
// the same ordered pairs at the same interval, during the same operation.
// The ring runs from before the operation starts to after coordctl
// returned and counts an answer whenever it arrives; its figures are taken
// over the probes sent in the mesh's window (meshWindow: the reset at
// prepare to the final read), its loss scaled by mesh sent / ring sent
// (ring lost': the ring's single sender skips ticks on a busy machine).
//
// Asserted, per operation: mesh lost <= meterOpFactor × Σ ring lost' + meterSlack × pairs
// and, from below:          mesh lost >= Σ ring lost / meterLowFactor - meterLowSlack
// and per pair:            mesh gap  <= ring gap + max(meterGapSlack, meterGapRatio × ring gap)
//   - stall(from) + stall(to)
//
// The loss bound is two-sided because neither meter is the reference: a
// mesh that over-reports (TestMeterAgreementBites) and one that hides loss
// the network caused (TestMeterAgreementBitesHiddenLoss) are both a meter
// that lies. Each operation is also checked beside a known outage
// (meterOutage), so the lower bound is exercised on hundreds of lost
// probes, not only on the few a good cutover loses.
//
// and every pair is in both reports. stall(n) is how far n's agent said it
// fell behind its own mesh (the report's probe_stall_micros): an agent the
// machine did not run neither probes nor answers, so every pair to and
// from it shows a longer gap than the ring, in another process, saw. A CI
// run without this term failed on the four pairs of one node, each 42-47 ms
// over the ring's gap, the rest of the lab within 5 ms of it.
//
// Reported but not asserted (pair_excess): the pairs outside
// mesh lost <= meterPairFactor × ring lost' + meterPairSlack. A run in CI
// saw 2 of 16 pairs over it (22 lost against the ring's 0, 30 against 3)
// while the operation's total stayed well inside the asserted bound: the
// same per-node excess as below, an open finding, so it is recorded for
// the results file and docs, not asserted until it is explained.
//
// Reported but not asserted either: the pairs outside the tighter
// mesh lost <= ring lost' + max(meterSlack, meterRatio × ring lost'). On the
// 2-core machine 0-8 of 16 pairs per operation exceed it, before and after
// the probe package's receive-time fix, often grouped on one or two nodes
// per operation (docs/lab.md, "Meter agreement"): an open finding, not noise
// the tight bound could absorb.
const (
	meterSlack      = 5
	meterRatio      = 0.2
	meterPairFactor = 2
	meterPairSlack  = 20
	// meterOpFactor bounds the mesh from above. On the loaded 2-core
	// machine the mesh's 8 agents lose more than the ring's one process:
	// an agent not scheduled for longer than the probe timeout counts its
	// late answers lost, which the ring (no timeout) never does, and the
	// per-node excess above can sit on most nodes at once. Observed
	// ratios of mesh lost to ring lost' were 0.5-2.9× (git log of this
	// line has each run); a mesh that ignores every 10th answer loses
	// 12-41× the ring (TestMeterAgreementBites), so 3× still bites.
	meterOpFactor = 3.0
	// meterLowFactor and meterLowSlack bound the mesh from below, against
	// the ring's raw count (not lost', which overstates the ring's loss
	// at the mesh's rate when its sender skipped ticks outside the outage
	// rather than in it). Most of what differs pushes the mesh up from
	// there: it sends at the full rate (the raw ring count is at the
	// ring's lower one) and its timeout counts late answers the ring
	// keeps. What pushes it down is an agent not sending while
	// descheduled in the outage, and where each meter's window cuts the
	// operation. Observed mesh / ring raw per operation: 0.55-2.7 (the
	// 0.55 a rollback, 75 against 137); a third of the ring's loss, the
	// upper factor's mirror, leaves that lowest ratio a margin of 1.6×
	// and still catches a mesh that hides two thirds of the loss or more
	// (TestMeterAgreementBitesHiddenLoss hides all of it). The slack is
	// two pairs' worth of meterSlack: the ring's own noise on an
	// operation that lost almost nothing (its idle second loses 0).
	meterLowFactor = 3
	meterLowSlack  = 2 * meterSlack
	meterGapSlack  = 40 * time.Millisecond
	meterGapRatio  = 0.5
	meterInterval  = time.Millisecond
	meterPeers     = 2
	meterNodes     = 8
	meterTimeout   = 200 * time.Millisecond // the lab's --probe-timeout at 1 ms
)

// probeDropEnv is probe.FaultInjectDropEnv (not imported: the lab's tests
// drive binaries, not agent packages).
const probeDropEnv = "COT_FAULTINJECT_PROBE_DROP_EVERY"

// probeHideLossEnv is probe.FaultInjectHideLossEnv: the tagged agent's
// mesh counts every probe received, answered or not.
const probeHideLossEnv = "COT_FAULTINJECT_PROBE_HIDE_LOSS"

// meterPair is one ordered pair's figures from both meters.
type meterPair struct {
	From       string  `json:"from"`
	To         string  `json:"to"`
	MeshSent   uint64  `json:"mesh_sent"`
	MeshLost   uint64  `json:"mesh_lost"`
	MeshGapMS  float64 `json:"mesh_longest_gap_ms"`
	RingSent   uint64  `json:"ring_sent"`
	RingLost   uint64  `json:"ring_lost"`
	RingGapMS  float64 `json:"ring_longest_gap_ms"`
	RingScaled float64 `json:"ring_lost_scaled"` // ring lost × mesh sent / ring sent
	AllowedMax uint64  `json:"mesh_lost_allowed"`
	Tight      bool    `json:"within_tight_bound"` // mesh lost <= ring lost' + max(5, 20%)
}

// meterOp is one operation's comparison.
type meterOp struct {
	Op           string      `json:"op"` // cutover 4789→4889, rollback …
	State        string      `json:"state"`
	SpreadMS     float64     `json:"commit_spread_ms"`
	MeshLost     uint64      `json:"mesh_lost"`
	MeshSent     uint64      `json:"mesh_sent"`
	MeshGapMS    float64     `json:"mesh_longest_gap_ms"`
	RingLost     uint64      `json:"ring_lost"`
	RingSent     uint64      `json:"ring_sent"`
	RingGapMS    float64     `json:"ring_longest_gap_ms"`
	RingMaxPair  uint64      `json:"ring_max_lost_per_pair"`
	MeshMaxPair  uint64      `json:"mesh_max_lost_per_pair"`
	MeshLostMin  uint64      `json:"mesh_lost_min"` // the asserted bounds on mesh_lost
	MeshLostMax  uint64      `json:"mesh_lost_max"`
	Violations   []string    `json:"violations,omitempty"`
	PairExcess   []string    `json:"pair_excess,omitempty"` // over the per-pair bound: reported, not asserted
	OutsideTight []string    `json:"outside_tight_bound,omitempty"`
	Pairs        []meterPair `json:"pairs"`
	LoadAvgAfter string      `json:"loadavg_after"`
	// UDPErrors is the growth of the nodes' UDP error counters
	// (/proc/net/snmp: RcvbufErrors, SndbufErrors, InErrors, NoPorts)
	// during the operation, summed over the nodes: a receive buffer that
	// overflowed shows here. The ring's sockets have 4 MiB buffers; the
	// agents' mesh sockets are what can overflow.
	UDPErrors map[string]int64 `json:"udp_errors"`
	// StallMS is how far each agent fell behind its probe mesh (the
	// report's probe_stall_micros), nodes over 1 ms only.
	StallMS map[string]float64 `json:"agent_stall_ms,omitempty"`
}

// meterRun is one test's figures (results/meter_agreement.json).
type meterRun struct {
	Test       string    `json:"test"`
	Backend    string    `json:"backend"`
	Nodes      int       `json:"nodes"`
	IntervalMS float64   `json:"interval_ms"`
	Peers      int       `json:"peers"`
	Fault      string    `json:"fault,omitempty"`
	Tolerance  string    `json:"tolerance"`
	IdleRing   uint64    `json:"idle_ring_lost"` // ring lost in one idle second before the first operation
	Ops        []meterOp `json:"ops"`
	When       string    `json:"when"`
	CPUs       int       `json:"cpus"`
	// Commit is this run's (the file's provenance is its last writer's,
	// and the file keeps other tests' runs beside it); runs written before
	// it have none: git log of the file has them.
	Commit string `json:"commit,omitempty"`
}

// agree compares the mesh's report with the ring's pairs and returns the
// operation's figures; Violations lists every pair outside the tolerance.
func agree(rep *coordinatorv1.Report, ring []lab.RingPair) meterOp {
	op := meterOp{State: rep.GetState().String(), SpreadMS: float64(rep.GetCommitSpreadNanos()) / 1e6}
	stall := map[string]time.Duration{}
	for _, n := range rep.GetNodes() {
		stall[n.GetNode()] = time.Duration(n.GetProbeStallMicros()) * time.Microsecond
	}
	var mesh []lab.PairStats
	for _, d := range rep.GetDisruption() {
		mesh = append(mesh, lab.PairStats{From: d.GetFrom(), To: d.GetTo(), Sent: d.GetSent(), Lost: d.GetLost(),
			LongestGap: time.Duration(d.GetLongestGapMicros()) * time.Microsecond})
	}
	compare(&op, mesh, stall, ring)
	return op
}

// compare fills op with the mesh's pairs (stall: how far each node's
// agent fell behind its mesh) against the ring's over the same window.
func compare(op *meterOp, mesh []lab.PairStats, stall map[string]time.Duration, ring []lab.RingPair) {
	byPair := map[[2]string]lab.RingPair{}
	for _, r := range ring {
		byPair[[2]string{r.From, r.To}] = r
	}
	seen := map[[2]string]bool{}
	for n, s := range stall {
		if s > time.Millisecond {
			if op.StallMS == nil {
				op.StallMS = map[string]float64{}
			}
			op.StallMS[n] = ms(s)
		}
	}
	var ringScaled float64
	for _, d := range mesh {
		k := [2]string{d.From, d.To}
		r, ok := byPair[k]
		if !ok {
			op.Violations = append(op.Violations, fmt.Sprintf("%s→%s: in the mesh's report, not in the ring", k[0], k[1]))
			continue
		}
		seen[k] = true
		meshGap := d.LongestGap
		// The ring's one sender in the test process skips ticks on a busy
		// machine (a ticker drops what it cannot deliver), so it sends
		// fewer probes than the mesh in the same window; an outage costs
		// each meter its duration over its own sending rate.
		scaled := float64(r.Lost)
		if r.Sent > 0 && d.Sent > r.Sent {
			scaled *= float64(d.Sent) / float64(r.Sent)
		}
		allowed := uint64(math.Ceil(meterPairFactor*scaled)) + meterPairSlack
		tight := uint64(math.Ceil(scaled)) + max(meterSlack, uint64(meterRatio*scaled))
		p := meterPair{From: k[0], To: k[1], MeshSent: d.Sent, MeshLost: d.Lost, MeshGapMS: ms(meshGap),
			RingSent: r.Sent, RingLost: r.Lost, RingGapMS: ms(r.LongestGap), RingScaled: math.Round(scaled*10) / 10,
			AllowedMax: allowed, Tight: d.Lost <= tight}
		op.Pairs = append(op.Pairs, p)
		op.MeshLost += p.MeshLost
		op.MeshSent += p.MeshSent
		op.RingLost += p.RingLost
		op.RingSent += p.RingSent
		ringScaled += scaled
		op.MeshMaxPair = max(op.MeshMaxPair, p.MeshLost)
		op.RingMaxPair = max(op.RingMaxPair, p.RingLost)
		op.MeshGapMS = max(op.MeshGapMS, p.MeshGapMS)
		op.RingGapMS = max(op.RingGapMS, p.RingGapMS)
		if !p.Tight {
			op.OutsideTight = append(op.OutsideTight, fmt.Sprintf("%s→%s %d/%.0f", k[0], k[1], p.MeshLost, scaled))
		}
		if p.MeshLost > allowed {
			op.PairExcess = append(op.PairExcess, fmt.Sprintf("%s→%s: mesh lost %d, ring lost %d (%.0f scaled to the mesh's %d probes): allowed at most %d", k[0], k[1], p.MeshLost, r.Lost, scaled, d.Sent, allowed))
		}
		stalled := stall[k[0]] + stall[k[1]]
		if gapAllowed := gapBound(r.LongestGap) + stalled; meshGap > gapAllowed {
			op.Violations = append(op.Violations, fmt.Sprintf("%s→%s: mesh longest gap %s, ring %s, agents behind their mesh %s: allowed at most %s", k[0], k[1], meshGap, r.LongestGap, stalled, gapAllowed))
		}
	}
	op.MeshLostMax = uint64(math.Ceil(meterOpFactor*ringScaled)) + meterSlack*uint64(len(op.Pairs))
	op.MeshLostMin = lossFloor(op.RingLost)
	if op.MeshLost > op.MeshLostMax {
		op.Violations = append(op.Violations, fmt.Sprintf("all pairs: mesh lost %d, ring lost %d (%.0f scaled): allowed at most %d", op.MeshLost, op.RingLost, ringScaled, op.MeshLostMax))
	}
	if op.MeshLost < op.MeshLostMin {
		op.Violations = append(op.Violations, fmt.Sprintf("all pairs: mesh lost %d, ring lost %d: the mesh hides loss the ring saw; want at least %d", op.MeshLost, op.RingLost, op.MeshLostMin))
	}
	for _, r := range ring {
		if !seen[[2]string{r.From, r.To}] {
			op.Violations = append(op.Violations, fmt.Sprintf("%s→%s: probed by the ring, missing from the mesh's report", r.From, r.To))
		}
	}
}

// lossFloor is the least loss the mesh may report over pairs whose ring
// lost ringLost (raw) in the same window.
func lossFloor(ringLost uint64) uint64 {
	return max(ringLost/meterLowFactor, meterLowSlack) - meterLowSlack
}

// gapBound is the longest gap the mesh may report for a pair whose ring
// gap was ring, before the agents' stall is added.
func gapBound(ring time.Duration) time.Duration {
	return ring + max(meterGapSlack, time.Duration(meterGapRatio*float64(ring)))
}

// meshWindow is when the mesh's figures in rep were sent: from the probe
// reset, which goes out with prepare (the report's start plus its
// preflight), to the final read (before the report's end) less the agents'
// probe timeout (probes younger than that are not settled yet; the
// coordinator's second read, --probe-settle later, covers most of them).
func meshWindow(rep *coordinatorv1.Report) (time.Time, time.Time) {
	from := time.Unix(0, rep.GetStartedUnixNano())
	for _, p := range rep.GetPhases() {
		if p.GetPhase() == "preflight" {
			from = from.Add(time.Duration(p.GetNanos()))
		}
	}
	return from, time.Unix(0, rep.GetEndedUnixNano()).Add(-meterTimeout)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// meterLab brings up the kernel-vxlan lab (agentBin: the agent to run) with
// probes every meterInterval to meterPeers peers, warms both meters and
// returns it with the idle ring loss.
func meterLab(t *testing.T, agentBin string, coordinatorArgs ...string) (*e2eLab, uint64) {
	bin := labtest.Binaries(t)
	cfg := newConfig(t, lab.BackendKernelVXLAN, meterNodes)
	cfg.StartProcesses = true
	cfg.AgentBin = agentBin
	if cfg.AgentBin == "" {
		cfg.AgentBin = filepath.Join(bin, "agent")
	}
	cfg.CoordinatorBin = filepath.Join(bin, "coordinator")
	cfg.ProbeInterval = meterInterval
	cfg.ProbePeers = meterPeers
	// A loaded 2-core machine can make every agent miss the default 200 ms
	// lateness budget (a rolled-back cutover measures nothing here): the
	// e2e tests' lead and a 1 s budget.
	cfg.ExtraCoordinatorArgs = append([]string{"--commit-lead-min", "1s", "--commit-late-budget", "1s", "--commit-answer-deadline", "1500ms"}, coordinatorArgs...)
	e := &e2eLab{t: t, l: up(t, cfg), cutoverLab: filepath.Join(bin, "cutover-lab")}
	if m, err := e.l.Mesh(context.Background(), 10*time.Second); err != nil || !m.AllOK() {
		t.Fatalf("overlay not complete before the test: %v\n%s", err, m)
	}
	ring, err := e.l.StartEchoRing(meterInterval, meterPeers)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	var idle uint64
	ring.Stop(300 * time.Millisecond)
	for _, p := range ring.Pairs(time.Time{}, time.Time{}) {
		idle += p.Lost
	}
	return e, idle
}

// meterOps runs rounds × (cutover to 4889, rollback of it), each with a
// fresh ring beside the mesh, and returns each operation's comparison.
func meterOps(t *testing.T, e *e2eLab, rounds int) []meterOp {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var ops []meterOp
	measure := func(what string, args ...string) *coordinatorv1.Report {
		ring, err := e.l.StartEchoRing(meterInterval, meterPeers)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		before := udpCounters(t, e.l)
		rep := e.report(ctx, 0, args...)
		ring.Stop(300 * time.Millisecond)
		from, to := meshWindow(rep)
		op := agree(rep, ring.Pairs(from, to))
		op.UDPErrors = map[string]int64{}
		for k, v := range udpCounters(t, e.l) {
			if d := v - before[k]; d != 0 {
				op.UDPErrors[k] = d
			}
		}
		op.Op = what
		op.LoadAvgAfter = loadavg()
		t.Logf("%s: %s spread %.2f ms: mesh lost %d/%d (worst pair %d, gap %.1f ms); ring lost %d/%d (worst pair %d, gap %.1f ms); UDP errors %v; outside the tight bound %v; agents behind their mesh (ms) %v; load %s",
			what, op.State, op.SpreadMS, op.MeshLost, op.MeshSent, op.MeshMaxPair, op.MeshGapMS, op.RingLost, op.RingSent, op.RingMaxPair, op.RingGapMS, op.UDPErrors, op.OutsideTight, op.StallMS, op.LoadAvgAfter)
		ops = append(ops, op)
		time.Sleep(500 * time.Millisecond) // let the machine settle between operations
		return rep
	}
	for i := range rounds {
		rep := measure(fmt.Sprintf("cutover %d: 8472→4889", i+1), "cutover", "--port", "4889")
		measure(fmt.Sprintf("rollback %d: 4889→8472", i+1), "rollback", rep.GetOperationId())
	}
	return ops
}

// udpCounters sums the UDP error counters of /proc/net/snmp over the
// lab's nodes, each read in its own namespace.
func udpCounters(t *testing.T, l *lab.Lab) map[string]int64 {
	t.Helper()
	sum := map[string]int64{}
	for _, n := range l.Nodes() {
		out, err := l.Exec(context.Background(), n.Name, "cat", "/proc/net/snmp")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f[1:]
				continue
			}
			for i, v := range f[1:] {
				if i < len(names) {
					switch names[i] {
					case "InErrors", "RcvbufErrors", "SndbufErrors", "NoPorts":
						x, _ := strconv.ParseInt(v, 10, 64)
						sum[names[i]] += x
					}
				}
			}
		}
	}
	return sum
}

// meterOutage measures both meters over a known outage and no operation:
// n1's overlay (udp/8472, the current port) blackholed at the hub for
// outageFor, so every pair to and from n1 loses about that long. It is
// where the lower loss bound has hundreds of probes to judge.
func meterOutage(t *testing.T, e *e2eLab) meterOp {
	const outageFor = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ring, err := e.l.StartEchoRing(meterInterval, meterPeers)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := e.l.ProbeStats(ctx, true); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	time.Sleep(200 * time.Millisecond)
	t.Cleanup(func() { _ = e.l.ClearBlackhole(context.Background(), "n1") })
	if err := e.l.BlackholeOverlay(ctx, "n1", 8472); err != nil {
		t.Fatal(err)
	}
	time.Sleep(outageFor)
	if err := e.l.ClearBlackhole(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // every probe of the outage settled
	read := time.Now()
	mesh, err := e.l.ProbeStats(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	ring.Stop(300 * time.Millisecond)
	stall := map[string]time.Duration{}
	for _, m := range mesh {
		stall[m.From] = max(stall[m.From], m.FromStall)
	}
	op := meterOp{Op: fmt.Sprintf("outage: n1's udp/8472 blackholed %s, no operation", outageFor), State: "NONE"}
	compare(&op, mesh, stall, ring.Pairs(from, read.Add(-meterTimeout)))
	op.LoadAvgAfter = loadavg()
	t.Logf("%s: mesh lost %d/%d (worst pair %d); ring lost %d/%d (worst pair %d); asserted %d..%d; load %s",
		op.Op, op.MeshLost, op.MeshSent, op.MeshMaxPair, op.RingLost, op.RingSent, op.RingMaxPair, op.MeshLostMin, op.MeshLostMax, op.LoadAvgAfter)
	return op
}

func meterRounds() int {
	if n, err := strconv.Atoi(os.Getenv("METER_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// writeMeter appends run to the JSON file METER_RESULTS names (make
// lab-meter), replacing an earlier run of the same test.
func writeMeter(t *testing.T, run meterRun) {
	p := os.Getenv("METER_RESULTS")
	if p == "" {
		return
	}
	var runs []meterRun
	_ = benchresult.Read(p, &runs) // a first run has no file yet
	out := []meterRun{}
	for _, r := range runs {
		if r.Test != run.Test {
			out = append(out, r)
		}
	}
	out = append(out, run)
	if err := benchresult.WriteFile(p, out); err != nil {
		t.Error(err)
	}
}

func newMeterRun(t *testing.T, idle uint64) meterRun {
	return meterRun{Test: t.Name(), Backend: lab.BackendKernelVXLAN, Nodes: meterNodes, IntervalMS: ms(meterInterval), Peers: meterPeers,
		Tolerance: fmt.Sprintf("over the mesh's window, ring lost' = ring lost x mesh sent / ring sent; reported only (pair_excess): per pair mesh lost <= %d x ring lost' + %d; asserted: per operation mesh lost <= %.1f x sum ring lost' + %d x pairs and >= sum ring lost / %d - %d; per pair mesh gap <= ring gap + max(%s, %.0f%%) + both agents' stall; reported only: pairs outside mesh lost <= ring lost' + max(%d, %.0f%%)",
			meterPairFactor, meterPairSlack, meterOpFactor, meterSlack, meterLowFactor, meterLowSlack, meterGapSlack, meterGapRatio*100, meterSlack, meterRatio*100),
		IdleRing: idle, When: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Commit: benchresult.Collect(filepath.Join("..", "..")).Commit}
}

// TestMeterAgreement: on the kernel-vxlan lab (8 nodes, probes every 1 ms to
// 2 peers), during cutovers and their rollbacks, the mesh reports per pair
// no more loss, and no longer a gap, than the independent ring saw, within
// the tolerance above.
func TestMeterAgreement(t *testing.T) {
	testenv.RequireRoot(t)
	e, idle := meterLab(t, "")
	run := newMeterRun(t, idle)
	run.Ops = append(meterOps(t, e, meterRounds()), meterOutage(t, e))
	writeMeter(t, run)
	for _, op := range run.Ops {
		for _, v := range op.Violations {
			t.Errorf("%s: %s", op.Op, v)
		}
		for _, v := range op.PairExcess {
			t.Logf("%s: over the per-pair bound (reported, not asserted): %s", op.Op, v)
		}
	}
}

// TestMeterAgreementBites: the same check against agents built with the
// test-only tag cutover_faultinject whose mesh ignores every 10th answer
// (a meter that loses what the network delivered) must fail.
func TestMeterAgreementBites(t *testing.T) {
	testenv.RequireRoot(t)
	t.Setenv(probeDropEnv, "10") // the lab's agents inherit it; only the tagged build reads it
	e, idle := meterLab(t, labtest.FaultInjectAgent(t))
	run := newMeterRun(t, idle)
	run.Fault = probeDropEnv + "=10: every agent's mesh ignores every 10th answer"
	run.Ops = meterOps(t, e, 1)
	writeMeter(t, run)
	for _, op := range run.Ops {
		if len(op.Violations) == 0 {
			t.Errorf("%s: the agreement check passed a mesh that ignores every 10th answer (mesh lost %d, ring lost %d)", op.Op, op.MeshLost, op.RingLost)
			continue
		}
		t.Logf("%s: caught (%d pairs), e.g. %s", op.Op, len(op.Violations), op.Violations[0])
	}
}

// TestMeterAgreementBitesHiddenLoss: the same check against agents built
// with cutover_faultinject whose mesh counts every probe received,
// answered or not (a meter that hides what the network lost), must fail
// from below: on the known outage always, and on every operation whose
// ring lost enough for the floor to be above zero.
func TestMeterAgreementBitesHiddenLoss(t *testing.T) {
	testenv.RequireRoot(t)
	t.Setenv(probeHideLossEnv, "1") // the lab's agents inherit it; only the tagged build reads it
	e, idle := meterLab(t, labtest.FaultInjectAgent(t))
	run := newMeterRun(t, idle)
	run.Fault = probeHideLossEnv + "=1: every agent's mesh counts every probe received"
	run.Ops = append(meterOps(t, e, 1), meterOutage(t, e))
	writeMeter(t, run)
	for i, op := range run.Ops {
		hidden := slices.ContainsFunc(op.Violations, func(v string) bool { return strings.Contains(v, "hides loss") })
		switch {
		case hidden:
			t.Logf("%s: caught: mesh lost %d, ring lost %d, want at least %d", op.Op, op.MeshLost, op.RingLost, op.MeshLostMin)
		case op.MeshLostMin > 0 || i == len(run.Ops)-1:
			t.Errorf("%s: the agreement check passed a mesh that hides loss (mesh lost %d, ring lost %d, floor %d)", op.Op, op.MeshLost, op.RingLost, op.MeshLostMin)
		default:
			t.Logf("%s: the ring lost %d, too few for the floor (0) to judge", op.Op, op.RingLost)
		}
	}
}

// TestAgentStallExplainsItsGaps: with the mesh and the ring probing and no
// operation, n1's agent is frozen (SIGSTOP) for 150 ms. Its agent must say
// it fell behind its mesh by about that long (the figure the report carries
// as probe_stall_micros), the pairs to and from n1 show a gap the ring, in
// the test process, did not see, and the gap check above passes them only
// with the stall term: the term is what it is for, and it is measured.
func TestAgentStallExplainsItsGaps(t *testing.T) {
	testenv.RequireRoot(t)
	const freeze = 150 * time.Millisecond // under the 200 ms probe timeout: late, never lost
	e, _ := meterLab(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ring, err := e.l.StartEchoRing(meterInterval, meterPeers)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := e.l.ProbeStats(ctx, true); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	time.Sleep(200 * time.Millisecond)
	p, err := e.l.Proc("agent", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Freeze(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Thaw(p) })
	time.Sleep(freeze)
	if err := lab.Thaw(p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // every probe of the freeze settled
	read := time.Now()
	mesh, err := e.l.ProbeStats(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	ring.Stop(300 * time.Millisecond)
	rings := map[[2]string]lab.RingPair{}
	for _, r := range ring.Pairs(from, read.Add(-meterTimeout)) {
		rings[[2]string{r.From, r.To}] = r
	}
	stall := map[string]time.Duration{}
	op := meterOp{Op: fmt.Sprintf("n1's agent frozen %s (SIGSTOP), no operation", freeze), StallMS: map[string]float64{}, LoadAvgAfter: loadavg()}
	for _, m := range mesh {
		stall[m.From] = m.FromStall
		op.StallMS[m.From] = ms(m.FromStall)
	}
	t.Logf("agents behind their mesh: %v", stall)
	if s := stall["n1"]; s < freeze-30*time.Millisecond || s > freeze+time.Second {
		t.Errorf("n1's agent, frozen %s, says it fell behind its mesh by %s", freeze, s)
	}
	if len(mesh) != meterNodes*meterPeers {
		t.Fatalf("%d pairs in the mesh's figures, want %d", len(mesh), meterNodes*meterPeers)
	}
	for _, m := range mesh {
		r, ok := rings[[2]string{m.From, m.To}]
		if !ok {
			t.Fatalf("%s→%s: not probed by the ring", m.From, m.To)
		}
		slack := gapBound(r.LongestGap)
		stalled := stall[m.From] + stall[m.To]
		op.Pairs = append(op.Pairs, meterPair{From: m.From, To: m.To, MeshSent: m.Sent, MeshLost: m.Lost, MeshGapMS: ms(m.LongestGap),
			RingSent: r.Sent, RingLost: r.Lost, RingGapMS: ms(r.LongestGap)})
		op.MeshGapMS, op.RingGapMS = max(op.MeshGapMS, ms(m.LongestGap)), max(op.RingGapMS, ms(r.LongestGap))
		t.Logf("%s→%s: mesh gap %s lost %d, ring gap %s lost %d, agents behind %s", m.From, m.To, m.LongestGap, m.Lost, r.LongestGap, r.Lost, stalled)
		if m.LongestGap > slack+stalled {
			t.Errorf("%s→%s: mesh gap %s over the ring's %s plus the agents' stall %s", m.From, m.To, m.LongestGap, r.LongestGap, stalled)
		}
		if (m.From == "n1" || m.To == "n1") && m.LongestGap <= slack {
			t.Errorf("%s→%s: mesh gap %s with n1's agent frozen %s: within the ring's %s plus the slack, the freeze not seen", m.From, m.To, m.LongestGap, freeze, r.LongestGap)
		}
	}
	run := newMeterRun(t, 0)
	run.Fault = op.Op
	run.Ops = []meterOp{op}
	writeMeter(t, run)
}

// TestMeterLossBoundsBothWays: the loss check, on figures made up to sit
// each side of it (no lab, no root): a mesh that hides the ring's loss and
// one that inflates it both fail, one that agrees passes, and a ring that
// lost almost nothing leaves a floor of 0.
func TestMeterLossBoundsBothWays(t *testing.T) {
	pairs := func(meshLost, ringLost uint64) ([]lab.PairStats, []lab.RingPair) {
		var m []lab.PairStats
		var r []lab.RingPair
		for i := range 16 {
			from, to := fmt.Sprintf("n%d", i%8+1), fmt.Sprintf("n%d", (i%8+1+i/8)%8+1)
			m = append(m, lab.PairStats{From: from, To: to, Sent: 1000, Lost: meshLost, LongestGap: 50 * time.Millisecond})
			r = append(r, lab.RingPair{From: from, To: to, Sent: 800, Lost: ringLost, LongestGap: 50 * time.Millisecond})
		}
		return m, r
	}
	for _, c := range []struct {
		name               string
		meshLost, ringLost uint64 // per pair
		want               string // a violation containing it, "" for none
	}{
		{"agree", 40, 40, ""},
		{"mesh loses more, within 3x", 100, 40, ""},
		{"mesh hides all loss", 0, 40, "hides loss"},
		{"mesh hides most loss", 10, 80, "hides loss"},
		{"mesh inflates loss", 200, 40, "allowed at most"},
		{"ring lost next to nothing", 0, 1, ""},
	} {
		m, r := pairs(c.meshLost, c.ringLost)
		var op meterOp
		compare(&op, m, map[string]time.Duration{}, r)
		got := strings.Join(op.Violations, "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s (mesh %d, ring %d per pair): violations %q, want one saying %q; bounds %d..%d",
				c.name, c.meshLost, c.ringLost, got, c.want, op.MeshLostMin, op.MeshLostMax)
		}
	}
}
