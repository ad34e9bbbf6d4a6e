package probes

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// Mesh makes the agent calls about the probe mesh: it zeroes the counters
// alongside prepare, reads them for the report when an operation that
// reached commit ends, verifies the mesh after commit (Verify), and parks
// a held operation's sample.
type Mesh struct {
	ctx    context.Context // the coordinator's: the calls end when it closes
	fleet  *fleet.Fleet
	settle time.Duration // --probe-settle: in-flight probes settle before the last read
	budget time.Duration // --verify-budget: how long Verify waits for every pair
	log    *slog.Logger
}

// New is the Mesh over the agents of fl.
func New(ctx context.Context, fl *fleet.Fleet, settle, budget time.Duration, log *slog.Logger) *Mesh {
	return &Mesh{ctx: ctx, fleet: fl, settle: settle, budget: budget, log: log}
}

// Park has every agent of a held operation drop the operation's
// probe sample (agent ProbeStats park): best effort, once the run's figures
// were read. A continuation's Prepare gives it back.
func (c *Mesh) Park(op *opstate.Op) {
	ctx, cancel := context.WithTimeout(c.ctx, min(probeStatsBound, op.Step))
	defer cancel()
	var mu sync.Mutex
	var missed []string
	fleet.FanOut(op.Nodes, func(n string) {
		if _, err := c.fleet.Agent(n).Client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{Park: true}); err != nil {
			mu.Lock()
			missed = append(missed, n)
			mu.Unlock()
		}
	})
	if len(missed) > 0 {
		slices.Sort(missed)
		op.Emit("held", "", fmt.Sprintf("probe mesh of %s not parked: they probe at the operation's rate until it ends or lingers out", strings.Join(missed, ",")), false, nil)
	}
}
