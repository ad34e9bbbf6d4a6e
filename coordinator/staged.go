package coordinator

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The staged strategy (docs/staged.md): every node listens on both ports,
// the senders switch batch by batch with the probe mesh verified after
// each, then the old port is retired. The barrier core runs it
// (barrier.Config.Batches); this file turns a request into batches.

// Strategies, as CutoverRequest.strategy spells them.
const (
	StrategyAtomic = "atomic"
	StrategyStaged = "staged"
	// StrategyAuto is resolved before preflight (resolveAuto): the report
	// and the journal name the strategy that ran.
	StrategyAuto = "auto"
)

// resolveAuto settles strategy "auto": staged when every node's agent
// accepts it (its staged preflight finds no problem) and says staged loses
// less there (PreflightResponse.staged_loses_less: the lab's figures for
// its backend as configured), else atomic, with why in
// strategyReason. One Preflight call per node, which changes nothing; the
// chosen strategy's own preflight follows. An unreachable node counts
// against staged: the atomic preflight then names it, without asking it
// again when it did not answer at all (request.unreached).
func (c *Coordinator) resolveAuto(ctx context.Context, req *coordinatorv1.CutoverRequest, r request) (request, error) {
	if !r.auto {
		return r, nil
	}
	type answer struct {
		pf  *agentv1.PreflightResponse
		err error
	}
	answers := map[string]answer{}
	var mu sync.Mutex
	fanOut(r.nodes, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, r.step)
		defer cancel()
		pf, err := c.agent(n).client.Preflight(cctx, &agentv1.PreflightRequest{OperationId: r.id, TargetPort: r.to, Strategy: StrategyStaged})
		mu.Lock()
		defer mu.Unlock()
		answers[n] = answer{pf, err}
	})
	// Nodes are grouped by what they said: 10,000 nodes of one backend
	// give one reason, not 10,000.
	against, why := map[string][]string{}, map[string][]string{}
	unreached := map[string]error{}
	count := 0
	for _, n := range r.nodes {
		a := answers[n]
		switch {
		case a.err != nil:
			k := "not answered: " + status.Convert(a.err).Message()
			against[k] = append(against[k], n)
			if code := status.Code(a.err); code == codes.Unavailable || code == codes.DeadlineExceeded {
				unreached[n] = a.err
			}
		case len(a.pf.GetProblems()) > 0:
			against[a.pf.GetProblems()[0]] = append(against[a.pf.GetProblems()[0]], n)
		case !a.pf.GetStagedLosesLess():
			note := a.pf.GetStrategyNote()
			if note == "" {
				note = "an agent older than strategy auto"
			}
			against[note] = append(against[note], n)
		default:
			why[a.pf.GetStrategyNote()] = append(why[a.pf.GetStrategyNote()], n)
			continue
		}
		count++
	}
	grouped := func(m map[string][]string) string {
		var parts []string
		for _, note := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%s (%s)", note, abbreviate(m[note], 5)))
		}
		if len(parts) > 3 {
			parts = append(parts[:3], fmt.Sprintf("… (%d more reasons)", len(parts)-3))
		}
		return strings.Join(parts, "; ")
	}
	if count == 0 {
		r.strategyReason = fmt.Sprintf("%s: staged, every node accepts it and loses less with it: %s", r.autoName(), grouped(why))
		return r, nil
	}
	atomic := proto.Clone(req).(*coordinatorv1.CutoverRequest)
	atomic.Strategy, atomic.OperationId = StrategyAtomic, r.id
	ra, err := c.validate(atomic)
	if err != nil {
		return r, err
	}
	ra.auto, ra.byDefault, ra.unreached = true, r.byDefault, unreached
	ra.strategyReason = fmt.Sprintf("%s: atomic, staged does not lose less on %d of %d node(s): %s", r.autoName(), count, len(r.nodes), grouped(against))
	return ra, nil
}

// autoName is how a reason names auto: asked for, or the default.
func (r request) autoName() string {
	if r.byDefault {
		return "auto (the coordinator's --default-strategy)"
	}
	return "auto"
}

// defaultBatches is a canary, then everyone else.
var defaultBatches = []string{"1", "100%"}

// parseStrategy validates CutoverRequest.strategy: true for staged.
func parseStrategy(s string) (bool, error) {
	switch s {
	case "", StrategyAtomic:
		return false, nil
	case StrategyStaged:
		return true, nil
	}
	return false, invalid("strategy", fmt.Sprintf("%q", s), fmt.Sprintf("want %q (every node at one instant) or %q (listen on both, switch senders in batches, retire)", StrategyAtomic, StrategyStaged))
}

// planBatches cuts nodes (sorted) into batches from cumulative sizes: a
// count ("1") or a percentage of the nodes ("10%", rounded up), each
// larger than the one before (a size that rounds to the previous one is
// skipped: percentages of a small cluster collide), the last covering
// every node. Pure; every error names the field, the value and the
// reason.
func planBatches(specs []string, nodes []string) ([][]string, error) {
	if len(specs) == 0 {
		specs = defaultBatches
	}
	n := len(nodes)
	var out [][]string
	prev := 0
	for i, spec := range specs {
		k, err := batchSize(spec, n)
		if err != nil {
			return nil, invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), err.Error())
		}
		if k > n {
			return nil, invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), fmt.Sprintf("%d nodes, but the operation targets %d", k, n))
		}
		if k < prev {
			return nil, invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), fmt.Sprintf("covers %d nodes, fewer than the batch before (%d): sizes are cumulative and must grow", k, prev))
		}
		if k == prev {
			continue
		}
		out = append(out, nodes[prev:k])
		prev = k
	}
	if prev != n {
		return nil, invalid("batches", fmt.Sprintf("%q", strings.Join(specs, ",")), fmt.Sprintf("the last batch covers %d of the %d nodes: end with 100%%", prev, n))
	}
	return out, nil
}

// batchSize is how many nodes spec covers out of n.
func batchSize(spec string, n int) (int, error) {
	s := strings.TrimSpace(spec)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 100 {
			return 0, fmt.Errorf("want a percentage in (0, 100]")
		}
		return int(math.Ceil(f * float64(n) / 100)), nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 {
		return 0, fmt.Errorf("want a node count (1 or more) or a percentage such as 10%%")
	}
	return k, nil
}

// waveSize is how many nodes a staged phase changes at a time: the
// request's (capped at n), else a tenth of n rounded up. A node's listen,
// switch or retire reconfigures its datapath; on nodes that share CPUs (the
// lab: every node's userspace datapath on two cores) all of them at once
// starved each other and lost probes in the retire, one at a time lost
// none (docs/staged.md, Figures). Ten waves at most keeps a large
// cluster's phase short.
func waveSize(req, n int) int {
	if n <= 0 {
		return 1
	}
	if req > 0 {
		return min(req, n)
	}
	return (n + 9) / 10
}

// waves is how many rounds a phase over n nodes takes at k at a time.
func waves(n, k int) int {
	if k <= 0 || n <= k {
		return 1
	}
	return (n + k - 1) / k
}

// reportBatches is the report's view of the batches.
func reportBatches(bs [][]string) []*coordinatorv1.StagedBatch {
	out := make([]*coordinatorv1.StagedBatch, len(bs))
	for i, b := range bs {
		out[i] = &coordinatorv1.StagedBatch{Nodes: b}
	}
	return out
}

// batchDone stamps batch b (1-based) of the report: switched (every node
// answered the switch) or verified (the mesh passed after it).
func (op *operation) batchDone(b int, at time.Time, verified bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	b += op.batchBase // a continued held operation's batches follow the earlier runs'
	if b < 1 || b > len(op.report.Batches) {
		return
	}
	if verified {
		op.report.Batches[b-1].VerifiedUnixNano = at.UnixNano()
	} else {
		op.report.Batches[b-1].SwitchedUnixNano = at.UnixNano()
	}
}
