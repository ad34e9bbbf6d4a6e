package probes

import (
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"

	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// probeStatsBound bounds the probe counters' reset and read: they are
// figures for the report, never worth holding an operation up for.
const probeStatsBound = time.Second

// Stats resets (alongside prepare) or reads (when an operation that
// reached commit ends, whatever its outcome) the agents' probe mesh
// counters, each call within min(1 s, step). Agents without peers report
// nothing: harmless. A node that does not answer is reported in an event,
// never fatal: its figures are missing, or for a failed reset include
// traffic from before the operation.
//
// Probes still in flight when the counters are read are not counted yet
// (an agent settles a probe when it is answered or timed out), so a read
// that finds probing on waits --probe-settle and reads again: the figures
// then cover the operation to its end. Without probing nothing waits.
func (c *Mesh) Stats(op *opstate.Op, reset bool) {
	c.statsOf(op, op.Nodes, reset, !reset && c.settle > 0)
}

// PrepReset is the probe counters' reset riding in the first Prepare
// (reset_probe_stats): done closes when that Prepare's fan-out ended, and
// old holds the nodes prepared without saying their counters were zeroed
// (agents older than the field). ResetProbes then calls ProbeStats with
// reset on those alone: at 10,000 agents the separate reset was 10,000
// calls more inside the prepare round. A node whose Prepare
// failed is not reset: the operation aborts, and its counters are never
// read (they are read only once Commit was sent).
type PrepReset struct {
	Done chan struct{}
	mu   sync.Mutex
	old  []string
}

// Answered notes node's answer to the Prepare the reset rode in.
func (r *PrepReset) Answered(node string, resp *agentv1.PrepareResponse, err error) {
	if err != nil || resp.GetProbeStatsReset() {
		return
	}
	r.mu.Lock()
	r.old = append(r.old, node)
	r.mu.Unlock()
}

// NewPrepReset is a reset riding in a Prepare's calls
// (barrier.Send.ResetProbes).
func NewPrepReset() *PrepReset { return &PrepReset{Done: make(chan struct{})} }

// Reset zeroes the agents' probe counters: once the Prepare that
// carried the reset is answered, those of the agents that did not do it
// (rides); without rides, every agent's.
func (c *Mesh) Reset(op *opstate.Op, rides *PrepReset) {
	if rides == nil {
		c.Stats(op, true)
		return
	}
	select {
	case <-rides.Done:
	case <-c.ctx.Done():
		return
	}
	rides.mu.Lock()
	old := rides.old
	rides.mu.Unlock()
	if len(old) > 0 {
		c.statsOf(op, old, true, false)
	}
}

// statsOf resets or reads the counters of nodes (Stats), reading
// again once after --probe-settle when settleThenAgain.
func (c *Mesh) statsOf(op *opstate.Op, nodes []string, reset, settleThenAgain bool) {
	ctx, cancel := context.WithTimeout(c.ctx, min(probeStatsBound, op.Step))
	defer cancel()
	var mu sync.Mutex
	var pairs []opstate.PairRead
	var missed []string
	stalls := map[string]int64{}
	fleet.FanOut(nodes, func(n string) {
		r, err := c.fleet.Agent(n).Client.ProbeStats(ctx, &agentv1.ProbeStatsRequest{Reset_: reset})
		if err != nil {
			mu.Lock()
			missed = append(missed, n+" ("+status.Convert(err).Message()+")")
			mu.Unlock()
			return
		}
		if reset {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		stalls[n] = r.GetMaxStallMicros()
		off := op.Offsets[n].Offset.Nanoseconds()
		for _, p := range r.Peers {
			rd := opstate.PairRead{Pair: &coordinatorv1.PairDisruption{From: n, To: p.Peer, Sent: p.Sent, Lost: p.Lost, LongestGapMicros: p.LongestGapMicros,
				LongestGapFromUnixNano: opstate.CoordClock(p.GetLongestGapFromUnixNano(), off)}}
			for _, l := range p.GetLossRuns() {
				rd.Runs = append(rd.Runs, opstate.LossSpan{First: opstate.CoordClock(l.GetFirstSentUnixNano(), off), Last: opstate.CoordClock(l.GetLastSentUnixNano(), off), Count: l.GetCount()})
			}
			pairs = append(pairs, rd)
		}
	})
	if len(missed) > 0 && c.ctx.Err() == nil {
		slices.Sort(missed)
		what := "read"
		if reset {
			what = "reset: their disruption figures include traffic from before the operation"
		}
		c.log.Warn("probe counters", "reset", reset, "missed", missed)
		op.Emit(op.CurPhase(), "", fmt.Sprintf("probe counters of %s could not be %s", strings.Join(missed, ", "), what), false, nil)
	}
	if reset {
		return
	}
	if settleThenAgain && len(pairs) > 0 {
		select {
		case <-time.After(c.settle):
			c.statsOf(op, nodes, false, false)
			return
		case <-c.ctx.Done():
		}
	}
	slices.SortFunc(pairs, func(x, y opstate.PairRead) int {
		a, b := x.Pair, y.Pair
		if a.From != b.From {
			return strings.Compare(a.From, b.From)
		}
		return strings.Compare(a.To, b.To)
	})
	op.NoteDisruption(pairs, stalls)
}
