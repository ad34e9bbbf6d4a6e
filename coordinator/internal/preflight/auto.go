package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ResolveAuto settles strategy "auto": staged when every node's agent
// accepts it (its staged preflight finds no problem) and says staged loses
// less there (PreflightResponse.staged_loses_less: the lab's figures for
// its backend as configured), else atomic, with why in
// strategyReason. One Preflight call per node, which changes nothing; the
// chosen strategy's own preflight follows. An unreachable node counts
// against staged: the atomic preflight then names it, without asking it
// again when it did not answer at all (request.unreached).
func (c *Checker) ResolveAuto(ctx context.Context, req *coordinatorv1.CutoverRequest, r Request) (Request, error) {
	if !r.Auto {
		return r, nil
	}
	type answer struct {
		pf  *agentv1.PreflightResponse
		err error
	}
	answers := map[string]answer{}
	var mu sync.Mutex
	fleet.FanOut(r.Nodes, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, r.Step)
		defer cancel()
		pf, err := c.fleet.Agent(n).Client.Preflight(cctx, &agentv1.PreflightRequest{OperationId: r.ID, TargetPort: r.To, Strategy: model.StrategyStaged})
		mu.Lock()
		defer mu.Unlock()
		answers[n] = answer{pf, err}
	})
	// Nodes are grouped by what they said: 10,000 nodes of one backend
	// give one reason, not 10,000.
	against, why := map[string][]string{}, map[string][]string{}
	unreached := map[string]error{}
	count := 0
	for _, n := range r.Nodes {
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
		r.StrategyReason = fmt.Sprintf("%s: staged, every node accepts it and loses less with it: %s", r.AutoName(), grouped(why))
		return r, nil
	}
	atomic := proto.Clone(req).(*coordinatorv1.CutoverRequest)
	atomic.Strategy, atomic.OperationId = model.StrategyAtomic, r.ID
	ra, err := c.Validate(atomic)
	if err != nil {
		return r, err
	}
	ra.Auto, ra.ByDefault, ra.Unreached = true, r.ByDefault, unreached
	ra.StrategyReason = fmt.Sprintf("%s: atomic, staged does not lose less on %d of %d node(s): %s", r.AutoName(), count, len(r.Nodes), grouped(against))
	return ra, nil
}

// AutoName is how a reason names auto: asked for, or the default.
func (r Request) AutoName() string {
	if r.ByDefault {
		return "auto (the coordinator's --default-strategy)"
	}
	return "auto"
}
