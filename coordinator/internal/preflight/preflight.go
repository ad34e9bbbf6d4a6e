package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/staging"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const nodePortMin, nodePortMax = 30000, 32767

var opIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Request is a validated CutoverRequest.
type Request struct {
	ID            string
	To            tunnelport.Port
	Nodes         []string // sorted
	Step          time.Duration
	AllowNodePort bool
	AllowTunnel   bool
	Tunnel        string // refused as another tunnel's port: which one
	AllowUnprobed bool   // targets without a probe address are left out, the result flagged
	// AllowPathProblems turns the path check's problems into warnings.
	AllowPathProblems bool
	// Auto: the request's strategy was "Auto", named or by default
	// (ResolveAuto settles staged or atomic; StrategyReason says why).
	Auto           bool
	StrategyReason string
	// ByDefault: the request named no strategy and the coordinator's
	// --default-strategy auto made it auto.
	ByDefault bool
	// Answers (auto settled) are the answers of auto's round of Preflight
	// calls, as the chosen strategy's preflight gives them: the preflight
	// asks Preflight of the nodes missing here alone. An error is an agent
	// that did not answer at all, counted unreachable without a second
	// wait of up to a step.
	Answers map[string]Answer
	// Staged is the Staged strategy; batches its batches (nil: atomic).
	Staged      bool
	Batches     [][]string
	MaxParallel int // staged: nodes changed at a time (resolved)
	// Targets (staged) are the nodes the request switches, sorted: the
	// --nodes/--selector subset, else every node. nodes is then every node
	// of the inventory: all of them listen on both ports.
	Targets []string
	Subset  bool // targets were named (nodes or selector)
	// Progress, when set, is told as preflight asks the agents (live
	// Progress of a streamed cutover); it must be safe for concurrent use.
	Progress func(*coordinatorv1.OperationEvent)
}

// Strategy is the request's Strategy as the agent API spells it.
func (r Request) Strategy() string {
	if r.Staged {
		return model.StrategyStaged
	}
	return model.StrategyAtomic
}

// asAtomic is r, validated with strategy staged as auto's requests are,
// as Validate makes it with strategy atomic: no batches, no waves, every
// node at one instant. Auto refuses what staged alone takes (batches,
// max_parallel, a subset), so nothing else differs and there is nothing
// to validate again.
func (r Request) asAtomic() Request {
	r.Staged, r.Batches, r.MaxParallel, r.Targets, r.Subset = false, nil, 0, nil, false
	return r
}

// maxStepMillis bounds a request's per-step deadline (timeout_millis).
const maxStepMillis = int64(time.Hour / time.Millisecond)

// Validate checks a request against the inventory alone (no agent is
// asked): every error is InvalidArgument.
func (c *Checker) Validate(req *coordinatorv1.CutoverRequest) (Request, error) {
	inv := c.fleet.Inventory()
	r := Request{AllowNodePort: req.AllowNodeportRange, AllowTunnel: req.AllowTunnelPort, Step: c.cfg.StepTimeout, AllowUnprobed: req.AllowUnprobed, AllowPathProblems: req.AllowPathProblems}
	to, err := tunnelport.From("port", int64(req.Port))
	if err != nil {
		return r, status.Error(codes.InvalidArgument, err.Error())
	}
	r.To = to
	switch {
	case to >= nodePortMin && to <= nodePortMax && !req.AllowNodeportRange:
		return r, model.Invalid("port", req.Port, fmt.Sprintf("inside the Kubernetes NodePort range %d–%d: pick another port or set allow_nodeport_range", nodePortMin, nodePortMax))
	}
	if req.TimeoutMillis < 0 {
		return r, model.Invalid("timeout_millis", req.TimeoutMillis, "negative: want 0 (default) or a positive number of milliseconds")
	}
	if req.TimeoutMillis > maxStepMillis {
		// Also keeps the Duration (and 3x it for the dead-man) from
		// overflowing into a negative deadline.
		return r, model.Invalid("timeout_millis", req.TimeoutMillis, fmt.Sprintf("too long: at most %d (1 h) per step", maxStepMillis))
	}
	if req.TimeoutMillis > 0 {
		r.Step = time.Duration(req.TimeoutMillis) * time.Millisecond
	}
	if req.OperationId != "" && !opIDRe.MatchString(req.OperationId) {
		return r, model.Invalid("operation_id", fmt.Sprintf("%q", req.OperationId), "want 1–64 of letters, digits, '.', '_', '-' starting with a letter or digit")
	}
	r.ID = req.OperationId
	if r.ID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		r.ID = "op-" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
	}
	if len(req.Nodes) > 0 && req.Selector != "" {
		return r, model.Invalid("nodes/selector", fmt.Sprintf("%v/%q", req.Nodes, req.Selector), "give nodes or a selector, not both")
	}
	switch {
	case len(req.Nodes) > 0:
		var unknown []string
		for _, n := range req.Nodes {
			if !slices.ContainsFunc(inv.Agents, func(a model.AgentSpec) bool { return a.Node == n }) {
				unknown = append(unknown, n)
			}
		}
		if len(unknown) > 0 {
			return r, model.Invalid("nodes", strings.Join(unknown, ","), fmt.Sprintf("not in the inventory (%d agents: %s)", len(inv.Agents), model.Abbreviate(inv.NodeNames(), 10)))
		}
		r.Nodes = slices.Compact(slices.Sorted(slices.Values(req.Nodes)))
	case req.Selector != "":
		sel, err := parseSelector(req.Selector)
		if err != nil {
			return r, model.Invalid("selector", fmt.Sprintf("%q", req.Selector), err.Error())
		}
		for _, a := range inv.Agents {
			if sel.matches(a.Labels) {
				r.Nodes = append(r.Nodes, a.Node)
			}
		}
		if len(r.Nodes) == 0 {
			return r, model.Invalid("selector", fmt.Sprintf("%q", req.Selector), "selects no agent of the inventory")
		}
	default:
		r.Nodes = inv.NodeNames()
	}
	strategy := req.Strategy
	if strategy == "" && c.cfg.DefaultStrategy == model.StrategyAuto && len(req.Batches) == 0 && req.MaxParallel == 0 && len(req.Nodes) == 0 && req.Selector == "" {
		// The coordinator's default: auto over the whole overlay. With
		// batches or waves (staged's alone) the request says what it
		// means, and a subset runs atomic, as it always has.
		r.ByDefault, strategy = true, model.StrategyAuto
	}
	if strategy == model.StrategyAuto {
		// auto picks one strategy for the whole overlay: what only one
		// of them takes is named with it.
		const pick = "strategy auto picks staged or atomic for every node of the overlay: name the strategy to use it"
		switch {
		case len(req.Batches) > 0:
			return r, model.Invalid("batches", fmt.Sprintf("%q", strings.Join(req.Batches, ",")), pick)
		case req.MaxParallel != 0:
			return r, model.Invalid("max_parallel", strconv.FormatUint(uint64(req.MaxParallel), 10), pick)
		case len(req.Nodes) > 0:
			return r, model.Invalid("nodes", fmt.Sprintf("%q", strings.Join(req.Nodes, ",")), pick)
		case req.Selector != "":
			return r, model.Invalid("selector", fmt.Sprintf("%q", req.Selector), pick)
		}
		r.Auto, strategy = true, model.StrategyStaged
	}
	if r.Staged, err = staging.ParseStrategy(strategy); err != nil {
		return r, err
	}
	switch {
	case !r.Staged && len(req.Batches) > 0:
		return r, model.Invalid("batches", fmt.Sprintf("%q", strings.Join(req.Batches, ",")), "only the staged strategy switches in batches: add strategy staged")
	case !r.Staged && req.MaxParallel != 0:
		return r, model.Invalid("max_parallel", strconv.FormatUint(uint64(req.MaxParallel), 10), "the atomic strategy changes every node at one instant: only the staged strategy changes nodes in waves")
	case r.Staged:
		// Every node listens on both ports; the targets (a subset, or
		// every node) switch. Untargeted nodes keep listening, and the
		// operation is Held, until a later run switches them.
		slices.Sort(r.Nodes)
		r.Targets, r.Subset = r.Nodes, len(req.Nodes) > 0 || req.Selector != ""
		r.Nodes = inv.NodeNames()
		slices.Sort(r.Nodes)
		if r.Batches, err = staging.PlanBatches(req.Batches, r.Targets); err != nil {
			return r, err
		}
		r.MaxParallel = staging.WaveSize(int(req.MaxParallel), len(r.Nodes))
	}
	// Last, so that r is complete: validateTarget tells "the current
	// port" (4789 usually is) from "another tunnel's port".
	if what, ok := tunnelport.WellKnown[r.To]; ok && !req.AllowTunnelPort {
		r.Tunnel = what
		return r, model.Invalid("port", req.Port, fmt.Sprintf("is the port of another tunnel (%s): pick another port or set allow_tunnel_port", what))
	}
	return r, nil
}

// ValidateTarget is validate, where a target refused as another tunnel's
// port that is in fact the current port of every targeted node is refused
// as that: the more useful message (4789, the usual current port, is also
// IANA VXLAN's). Only then are agents asked, Info alone, changing nothing.
func (c *Checker) ValidateTarget(ctx context.Context, req *coordinatorv1.CutoverRequest) (Request, error) {
	r, err := c.Validate(req)
	if err == nil || r.Tunnel == "" {
		return r, err
	}
	cctx, cancel := context.WithTimeout(ctx, min(r.Step, 2*time.Second))
	defer cancel()
	var mu sync.Mutex
	on, answered := 0, 0
	fleet.FanOut(r.Nodes, func(n string) {
		info, ierr := c.fleet.Agent(n).Client.Info(cctx, &agentv1.InfoRequest{})
		mu.Lock()
		defer mu.Unlock()
		if ierr == nil {
			answered++
			if info.GetCurrentPort() == r.To.Wire() {
				on++
			}
		}
	})
	if answered > 0 && on == answered {
		return r, model.Invalid("port", req.Port, fmt.Sprintf("is the current port of every targeted node (%d of %d answered): the target must differ from the current port; nothing to do", answered, len(r.Nodes)))
	}
	return r, err
}

// repeats reports whether line is one of problems, alone or after a
// "where: " prefix ("backend: vxlan0 not found in OVS bridge br0: ...").
func repeats(line string, problems []string) bool {
	for _, p := range problems {
		if line == p || strings.HasSuffix(line, ": "+p) {
			return true
		}
	}
	return false
}

type selector map[string]string

// parseSelector parses k=v[,k=v].
func parseSelector(s string) (selector, error) {
	sel := selector{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("term %q: want key=value[,key=value]", part)
		}
		if _, dup := sel[k]; dup {
			return nil, fmt.Errorf("key %q given twice", k)
		}
		sel[k] = v
	}
	return sel, nil
}

func (s selector) matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// NodeCheck is what preflight learnt about one node.
type NodeCheck struct {
	Info      *agentv1.InfoResponse
	Preflight *agentv1.PreflightResponse
	Clock     fleet.ClockSample
	Err       error // agent unreachable
}

// Result is the outcome of a preflight over a request.
type Result struct {
	From     tunnelport.Port
	Round    time.Duration // until the last Preflight answer: the fan-out's cost (the path check's lead)
	Checks   map[string]*NodeCheck
	Problems []string // empty: the cutover may go
	Resp     *coordinatorv1.PlanResponse
	Probes   *ProbePlan // the probe mesh sample (probeplan.go)
	// PathWarnings are the path check's problems an operator accepted
	// (allow_path_problems), or that it was off: they flag the result.
	PathWarnings []string
}

// runPreflight asks every targeted agent (Info, Preflight, Clock) and
// collects every problem by node. It changes nothing (I3).
func (c *Checker) runPreflight(ctx context.Context, r Request) *Result {
	p := &Result{Checks: map[string]*NodeCheck{}}
	var mu sync.Mutex
	start := time.Now()
	r.tell(&coordinatorv1.OperationEvent{Phase: "preflight", Message: fmt.Sprintf("preflight: asking %d agent(s)", len(r.Nodes)), StepNodes: r.Nodes})
	fleet.FanOut(r.Nodes, func(n string) {
		ac := c.fleet.Agent(n)
		nc := &NodeCheck{}
		cctx, cancel := context.WithTimeout(ctx, r.Step)
		defer cancel()
		// Strategy auto asked already (r.Answers): one Preflight call per
		// node. Info rides in the preflight's answer: one call per node,
		// not two. An agent older than that field is asked Info.
		a, asked := r.Answers[n]
		if !asked {
			a.Preflight, a.Err = ac.Client.Preflight(cctx, &agentv1.PreflightRequest{OperationId: r.ID, TargetPort: r.To.Wire(), Strategy: r.Strategy()})
		}
		nc.Preflight, nc.Err = a.Preflight, a.Err
		if nc.Info = nc.Preflight.GetInfo(); nc.Err == nil && nc.Info == nil {
			nc.Info, nc.Err = ac.Client.Info(cctx, &agentv1.InfoRequest{})
		}
		took := max(a.Took, time.Since(start)) // an answer of auto's round took a.Took in it
		mu.Lock()
		p.Round = max(p.Round, took)
		mu.Unlock()
		if nc.Err == nil {
			nc.Clock, nc.Err = c.fleet.MeasureClock(cctx, ac.Client)
		}
		mu.Lock()
		p.Checks[n] = nc
		mu.Unlock()
		if nc.Err != nil {
			r.tell(&coordinatorv1.OperationEvent{Phase: "preflight", Node: n, NodeDone: true, Failed: true, Message: "preflight: " + status.Convert(nc.Err).Message()})
		} else {
			r.tell(&coordinatorv1.OperationEvent{Phase: "preflight", Node: n, NodeDone: true, Message: "preflight: ok"})
		}
	})
	resp := &coordinatorv1.PlanResponse{TargetPort: r.To.Wire()}
	byPort := map[tunnelport.Port][]string{}
	ready := 0
	for _, n := range r.Nodes {
		nc := p.Checks[n]
		np := &coordinatorv1.NodePlan{Node: n}
		resp.Nodes = append(resp.Nodes, np)
		if nc.Err != nil {
			np.Problems = append(np.Problems, fmt.Sprintf("agent at %s unreachable: %s", c.fleet.Agent(n).Spec.Address, status.Convert(nc.Err).Message()))
			continue
		}
		np.CurrentPort = nc.Info.CurrentPort
		// Port 0 is an agent that could not read its tunnel (its interface
		// deleted, OVS down): it says why among its problems. Counted as a
		// port, it would show as drift ("0 on n3") and hide the cause.
		read := nc.Info.CurrentPort != 0
		if read {
			if cur, err := tunnelport.From("current_port", int64(nc.Info.CurrentPort)); err != nil {
				np.Problems = append(np.Problems, "the agent reports "+err.Error())
				read = false
			} else {
				byPort[cur] = append(byPort[cur], n)
			}
		}
		if !nc.Info.Ready {
			// What its preflight reports anyway (prefixed by where the
			// agent found it) is said once, in the preflight's words.
			var why []string
			for _, nr := range nc.Info.NotReady {
				if !repeats(nr, nc.Preflight.Problems) {
					why = append(why, nr)
				}
			}
			if len(why) > 0 {
				np.Problems = append(np.Problems, fmt.Sprintf("agent not ready: %s", strings.Join(why, ", ")))
			}
		} else {
			ready++
		}
		if op := nc.Info.Operation; op != nil {
			switch op.Phase {
			case agentv1.Phase_PHASE_PREPARED, agentv1.Phase_PHASE_COMMITTED:
				np.Problems = append(np.Problems, fmt.Sprintf("operation %s is in flight on the agent (%s): wait for it to end, or roll it back (coordctl rollback %s)", op.OperationId, op.Phase, op.OperationId))
			case agentv1.Phase_PHASE_FAILED:
				np.Problems = append(np.Problems, fmt.Sprintf("operation %s failed on the agent and needs an operator: %s (put the dataplane right, then coordctl rollback %s)", op.OperationId, op.Error, op.OperationId))
			}
		}
		if nc.Info.CurrentPort == r.To.Wire() {
			np.Problems = append(np.Problems, fmt.Sprintf("already on port %d: the target must differ from the current port", r.To))
		}
		np.TargetPortFree = nc.Preflight.TargetPortFree
		// An agent that could not read its tunnel may have returned before
		// checking the target port: "not free" with nobody named is then
		// not a finding, and its problems already stop the cutover.
		if !nc.Preflight.TargetPortFree && (nc.Preflight.TargetPortUser != "" || (read && nc.Preflight.CurrentPort != 0)) {
			who := nc.Preflight.TargetPortUser
			if who == "" {
				who = "another socket"
			}
			np.Problems = append(np.Problems, fmt.Sprintf("target port %d is not free: held by %s; pick another port or stop what holds it", r.To, who))
		}
		for _, pr := range nc.Preflight.Problems {
			if !slices.Contains(np.Problems, pr) {
				np.Problems = append(np.Problems, pr)
			}
		}
		if !read && len(np.Problems) == 0 {
			// Left out of the drift count above, it must still stop the
			// cutover: nobody knows which port this node is on.
			np.Problems = append(np.Problems, fmt.Sprintf("current port not read back (agent %s reported 0 and no reason): check the agent's log and /readyz", c.fleet.Agent(n).Spec.Address))
		}
		np.Actions = nc.Preflight.Actions
	}
	c.metrics.AgentsReady.Set(float64(ready))
	for _, np := range resp.Nodes {
		for _, pr := range np.Problems {
			p.Problems = append(p.Problems, np.Node+": "+pr)
		}
	}
	if len(byPort) > 1 {
		var parts []string
		for _, port := range slices.Sorted(maps.Keys(byPort)) {
			parts = append(parts, fmt.Sprintf("%d on %s", port, model.Abbreviate(byPort[port], 10)))
		}
		p.Problems = append(p.Problems, "current port differs between nodes (drift): "+strings.Join(parts, "; "))
	}
	// I1: the request must not leave its overlay on two ports (overlays.go).
	p.Problems = append(p.Problems, c.overlayProblems(ctx, r, p)...)
	// The common port; with drift, the one most nodes are on (reported, never used).
	for port, ns := range byPort {
		if len(ns) > len(byPort[p.From]) || (len(ns) == len(byPort[p.From]) && port < p.From) {
			p.From = port
		}
	}
	resp.CurrentPort = p.From.Wire()
	resp.Problems = p.Problems
	p.Resp = resp
	return p
}

// tell reports preflight progress when someone follows it.
func (r Request) tell(ev *coordinatorv1.OperationEvent) {
	if r.Progress == nil {
		return
	}
	ev.OperationId, ev.UnixNano = r.ID, time.Now().UnixNano()
	r.Progress(ev)
}
