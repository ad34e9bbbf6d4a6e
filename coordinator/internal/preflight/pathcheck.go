package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/pathjudge"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The underlay path check (docs/pathcheck.md): before anything
// changes, every targeted agent binds the target port on its underlay
// address and exchanges real VXLAN frames with its peers, both ways, at
// the overlay's VNIs and up to its full frame size with DF set. What
// passed is judged by internal/pathjudge, which also plans who exchanges
// frames with whom and at which sizes.

// defaultOverlayMTU is assumed when no agent reports its overlay's MTU:
// openshift-sdn's and flannel's default on a 1500-byte underlay.
const defaultOverlayMTU = 1450

// The path check's start lead: pathLeadMin plus the longer of the round
// of calls just before it to the same agents (the fan-out's measured
// cost: the PathCheck calls go out the same way) and three times the worst
// agent round trip; at most maxPathLead, under the agents' refusal of a
// start more than 5 s ahead (agent maxPathDelay). It was 3 ms per node:
// 3.1 s at 1,000 nodes, and past 1,633 nodes over the agents' bound, so
// the agents the fan-out reached first refused the check.
const (
	pathLeadMin = 100 * time.Millisecond
	maxPathLead = 4500 * time.Millisecond
)

// pathLead is the path check's start lead after a round of calls that
// took round, with the agents' clock samples.
func pathLead(round time.Duration, clocks map[string]fleet.ClockSample) time.Duration {
	lead := pathLeadMin + round
	for _, cs := range clocks {
		lead = max(lead, pathLeadMin+3*cs.RTT)
	}
	return min(lead, maxPathLead)
}

// pathCheck runs the check on port between nodes, whose Info answers
// are in infos (nil: not reached, with the error in errs), gathered by a
// round of calls that took round. It changes nothing: each agent's socket
// is closed when its PathCheck returns.
func (c *Checker) pathCheck(ctx context.Context, id string, to tunnelport.Port, nodes []string, infos map[string]*agentv1.InfoResponse, errs map[string]error, clocks map[string]fleet.ClockSample, round time.Duration) *coordinatorv1.PathCheckResult {
	// The check speaks the agents' PathCheck messages (pathjudge judges
	// their answers): the port as they carry it.
	port := to.Wire()
	start := time.Now()
	res := &coordinatorv1.PathCheckResult{Port: port}
	m := &pathjudge.Matrix{Port: port, Failed: map[string]string{}, Sides: map[string]pathjudge.Side{}, Lead: pathLead(round, clocks)}
	addr := map[string]string{}
	var checked []string
	var mtu uint32
	for _, n := range nodes {
		info := infos[n]
		switch {
		case info == nil:
			why := "agent unreachable"
			if e := errs[n]; e != nil {
				why += ": " + status.Convert(e).Message()
			}
			m.Failed[n] = why
			continue
		case info.UnderlayAddress == "":
			m.Failed[n] = info.PathCheckOffReason
			if m.Failed[n] == "" {
				m.Failed[n] = "the agent reports no underlay address (an agent without the path check?)"
			}
			continue
		}
		addr[n] = info.UnderlayAddress
		checked = append(checked, n)
		for _, v := range info.OverlayVnis {
			if !slices.Contains(m.VNIs, v) && len(m.VNIs) < 7 {
				m.VNIs = append(m.VNIs, v)
			}
		}
		if info.OverlayMtu > 0 && (mtu == 0 || info.OverlayMtu < mtu) {
			mtu = info.OverlayMtu
		}
	}
	if len(m.VNIs) == 0 {
		m.VNIs = []uint32{0}
	}
	slices.Sort(m.VNIs)
	if mtu == 0 {
		mtu = defaultOverlayMTU
		res.Notes = append(res.Notes, fmt.Sprintf("no agent reported its overlay MTU: %d assumed (set the agents' --overlay-mtu)", mtu))
	}
	m.Reference = pathjudge.ReferenceVNI(m.VNIs)
	m.Sizes = pathjudge.Sizes(mtu)
	var sampling string
	m.Peers, sampling = pathjudge.Peers(checked, c.cfg.PathSampleAbove, c.cfg.PathPeersK)
	res.Vnis, res.ReferenceVni, res.OverlayMtu, res.Sizes, res.Sampling = m.VNIs, m.Reference, mtu, m.Sizes, sampling
	res.Nodes = uint32(len(checked))
	// The control: the current port most checked nodes report.
	ports := map[uint32]int{}
	for _, n := range checked {
		if p := infos[n].CurrentPort; p != 0 && p != port {
			ports[p]++
		}
	}
	for p, k := range ports {
		if k > ports[m.Control] || (k == ports[m.Control] && p < m.Control) {
			m.Control = p
		}
	}
	m.ControlVNI = m.VNIs[0]
	res.ControlPort = m.Control

	var exchange time.Duration
	m.Sides, exchange = c.pathRound(ctx, id+"/path", port, m, checked, addr, clocks, m.Peers, m.Failed)
	res.LeadMicros, res.ExchangeMicros = m.Lead.Microseconds(), exchange.Microseconds()
	j := m.Judge()
	// More rounds for the directions that failed, alone: on a loaded
	// machine a clean pair can lose all of a round's frames (docs/
	// pathcheck.md, "Limits"), while a blocked one never passes. A
	// direction passes when it passed in any round; at most pathRetries
	// more rounds, while they still help.
	// A warning (a problem the current port shares) flags the result, so
	// it is asked again too.
	first := pathjudge.FailedDirections(j.Pairs)
	var retried []string
	for round := 2; round <= 1+pathRetries && len(j.Problems)+len(j.Warnings) > 0; round++ {
		again := pathjudge.RetryPeers(j.Pairs)
		if len(again) == 0 {
			break
		}
		before := pathjudge.FailedDirections(j.Pairs)
		// A node whose call fails now keeps its earlier rounds' answers.
		more, _ := c.pathRound(ctx, fmt.Sprintf("%s/path%d", id, round), port, m, slices.Sorted(maps.Keys(again)), addr, clocks, again, map[string]string{})
		for n, side := range more {
			if m.Sides[n] == nil {
				m.Sides[n] = pathjudge.Side{}
			}
			pathjudge.MergeSide(m.Sides[n], side)
		}
		j = m.Judge()
		retried = append(retried, fmt.Sprint(len(again)))
		if pathjudge.FailedDirections(j.Pairs) >= before {
			break
		}
	}
	res.Pairs, res.Problems, res.Warnings = j.Pairs, j.Problems, j.Warnings
	res.Notes = append(res.Notes, j.Notes...)
	if len(retried) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the nodes of the failed directions were checked again on their own (%s node(s) in %d more round(s)): %d failed direction(s) before, %d after",
			strings.Join(retried, ", then "), len(retried), first, pathjudge.FailedDirections(j.Pairs)))
	}
	var noCapture []string
	for _, n := range checked {
		for _, byFrame := range m.Sides[n] {
			if r := byFrame[pathjudge.Frame{VNI: m.ControlVNI, Size: m.Sizes[0], Control: true}]; r != nil && r.ControlError != "" {
				noCapture = append(noCapture, n+": "+r.ControlError)
				break
			}
		}
	}
	if len(noCapture) > 0 {
		res.Notes = append(res.Notes, "no packet capture on "+model.Abbreviate(noCapture, 5)+": a pair blocked there is reported blocked, not inconclusive, and a drop by that node's own firewall cannot be told from the underlay's")
	}
	for _, p := range res.Pairs {
		if p.Verdict != "not_checked" {
			res.PairsChecked++
		}
		if p.Verdict == "blocked" {
			res.BlockedPairs++
		}
	}
	res.TookMicros = time.Since(start).Microseconds()
	result := "passed"
	if len(res.Problems) > 0 {
		result = "problems"
	}
	c.metrics.PathChecks.WithLabelValues(result).Inc()
	c.metrics.PathBlocked.Set(float64(res.BlockedPairs))
	return res
}

// preflightPath runs the path check of a preflight on the agents pf
// reached. Its problems refuse the cutover, or with allow_path_problems
// become the result's warnings.
func (c *Checker) preflightPath(ctx context.Context, r Request, pf *Result) {
	if c.cfg.NoPathCheck {
		pf.PathWarnings = append(pf.PathWarnings, fmt.Sprintf("underlay path check off (--path-check=false): udp/%d was not checked between the nodes", r.To))
		return
	}
	if len(r.Nodes) < 2 {
		return
	}
	infos, errs, clocks := map[string]*agentv1.InfoResponse{}, map[string]error{}, map[string]fleet.ClockSample{}
	for n, nc := range pf.Checks {
		if nc.Err != nil {
			errs[n] = nc.Err
			continue
		}
		infos[n], clocks[n] = nc.Info, nc.Clock
	}
	res := c.pathCheck(ctx, r.ID, r.To, r.Nodes, infos, errs, clocks, pf.Round)
	pf.Resp.PathCheck = res
	// What the current port shows as well is no reason to refuse: the
	// check is there to say whether the new port is worse.
	pf.PathWarnings = append(pf.PathWarnings, res.Warnings...)
	if len(res.Problems) == 0 {
		return
	}
	if r.AllowPathProblems {
		for _, p := range res.Problems {
			pf.PathWarnings = append(pf.PathWarnings, p+" (accepted: allow_path_problems)")
		}
		return
	}
	pf.Problems = append(pf.Problems, res.Problems...)
	pf.Resp.Problems = pf.Problems
}

// PathCheck is the path check alone, on the request's port and nodes
// (CoordinatorService.PathCheck). Changes nothing.
func (c *Checker) PathCheck(ctx context.Context, req *coordinatorv1.CutoverRequest) (*coordinatorv1.PathCheckResult, error) {
	r, err := c.Validate(req)
	if err != nil {
		return nil, err
	}
	infos, errs, clocks := map[string]*agentv1.InfoResponse{}, map[string]error{}, map[string]fleet.ClockSample{}
	var mu sync.Mutex
	var round time.Duration // until the last Info answer: the fan-out's cost
	start := time.Now()
	fleet.FanOut(r.Nodes, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, r.Step)
		defer cancel()
		cl := c.fleet.Agent(n).Client
		info, err := cl.Info(cctx, &agentv1.InfoRequest{})
		took := time.Since(start)
		mu.Lock()
		round = max(round, took)
		mu.Unlock()
		var cs fleet.ClockSample
		if err == nil {
			cs, err = c.fleet.MeasureClock(cctx, cl)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs[n] = err
			return
		}
		infos[n], clocks[n] = info, cs
	})
	res := c.pathCheck(ctx, r.ID, r.To, r.Nodes, infos, errs, clocks, round)
	for _, n := range r.Nodes {
		if info := infos[n]; info != nil && info.CurrentPort == r.To.Wire() {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: already on port %d: the overlay holds it, the check cannot bind it", n, r.To))
		}
	}
	return res, nil
}

// pathRetries is how many rounds, at most, follow the first for the
// directions that failed.
const pathRetries = 3

// pathRound runs one round of the path check: every node in nodes binds
// the port at one instant and exchanges frames with its peers. It returns
// what each answered, and how long after the start instant the last
// answer came; a node whose call failed is put in failed with why.
func (c *Checker) pathRound(ctx context.Context, checkID string, port uint32, m *pathjudge.Matrix, nodes []string, addr map[string]string,
	clocks map[string]fleet.ClockSample, peers map[string][]string, failed map[string]string) (map[string]pathjudge.Side, time.Duration) {
	sides := map[string]pathjudge.Side{}
	var last time.Duration
	var mu sync.Mutex
	window := c.cfg.PathWindow
	// One start instant for every agent, in its own clock, far enough
	// ahead for the fan-out to reach them all: otherwise a late agent's
	// window would miss the others' and its pairs look blocked.
	lead := m.Lead
	at := time.Now().Add(lead)
	fleet.FanOut(nodes, func(n string) {
		req := &agentv1.PathCheckRequest{CheckId: checkID, Port: port, Vnis: append(slices.Clone(m.VNIs), m.Reference), Sizes: m.Sizes,
			WindowMillis: window.Milliseconds(), IntervalMillis: c.cfg.PathInterval.Milliseconds(),
			ControlPort: m.Control, ControlVni: m.ControlVNI}
		if cs, ok := clocks[n]; ok {
			req.StartUnixNano = at.Add(cs.Offset).UnixNano()
		}
		for _, p := range peers[n] {
			req.Peers = append(req.Peers, &agentv1.PathPeer{Name: p, Address: addr[p]})
		}
		// Every agent answers at the window's end, all at once: the
		// answers come back as the calls went out, so they get as long as
		// the fan-out was given (the lead) on top of 2 s. At 10,000
		// simulated agents a bound of 2 s after the window left answers
		// unread in one operation of six, and preflight refused the cutover
		// for an underlay it had not judged (make bench-coordinator).
		cctx, cancel := context.WithDeadline(ctx, at.Add(window+2*time.Second+lead))
		defer cancel()
		resp, err := c.fleet.Agent(n).Client.PathCheck(cctx, req)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed[n] = status.Convert(err).Message()
			return
		}
		last = max(last, time.Since(at))
		sides[n] = pathjudge.SideOf(resp)
	})
	return sides, last
}
