package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The staged strategy (docs/staged.md): every node listens on both ports,
// the senders switch batch by batch with the probe mesh verified after
// each, then the old port is retired. The barrier core runs it
// (barrier.Config.Batches); internal/staging cuts the batches; this file
// settles strategy "auto" and stamps the report's batches as they pass.

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
	fleet.FanOut(r.nodes, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, r.step)
		defer cancel()
		pf, err := c.fleet.Agent(n).Client.Preflight(cctx, &agentv1.PreflightRequest{OperationId: r.id, TargetPort: r.to, Strategy: StrategyStaged})
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
			parts = append(parts, fmt.Sprintf("%s (%s)", note, model.Abbreviate(m[note], 5)))
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
