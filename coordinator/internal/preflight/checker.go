package preflight

import (
	"context"
	"slices"

	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/metrics"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
)

// Checker judges requests: it validates them against the inventory and
// asks the agents and the hooks whether the change may go, changing
// nothing (I3).
type Checker struct {
	cfg     config.Config
	fleet   *fleet.Fleet
	hooks   []model.Hook
	metrics *metrics.Metrics
}

// New is a Checker over the agents of fl, with the hooks' preflight.
func New(cfg config.Config, fl *fleet.Fleet, hooks []model.Hook, m *metrics.Metrics) *Checker {
	return &Checker{cfg: cfg, fleet: fl, hooks: hooks, metrics: m}
}

// Full is the agents' preflight plus the hooks': the cutover,
// the dry run and Plan all judge by it.
func (c *Checker) Full(ctx context.Context, r Request, kind string) *Result {
	pf := c.runPreflight(ctx, r)
	pf.Probes = c.PlanProbes(ctx, r, pf.Checks)
	if len(pf.Probes.Problems) > 0 {
		pf.Problems = append(pf.Problems, pf.Probes.Problems...)
		pf.Resp.Problems = pf.Problems
	}
	c.preflightPath(ctx, r, pf)
	if len(c.hooks) == 0 {
		return pf
	}
	steps, probs := c.preflightHooks(ctx, model.OpInfo{ID: r.ID, Kind: kind, FromPort: pf.From, ToPort: r.To, Nodes: slices.Clone(r.Nodes)})
	pf.Problems = append(pf.Problems, probs...)
	pf.Resp.Problems = pf.Problems
	pf.Resp.HookSteps = steps
	return pf
}

// preflightHooks asks every hook for problems, and a model.Planner for the
// steps it will take too; each line is prefixed with the hook's name.
func (c *Checker) preflightHooks(ctx context.Context, info model.OpInfo) (steps, problems []string) {
	for _, h := range c.hooks {
		var s, p []string
		if pl, ok := h.(model.Planner); ok {
			s, p = pl.Plan(ctx, info)
		} else {
			p = h.Preflight(ctx, info)
		}
		for _, l := range s {
			steps = append(steps, h.Name()+": "+l)
		}
		for _, l := range p {
			problems = append(problems, h.Name()+": "+l)
		}
	}
	return steps, problems
}
