package probes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/probemesh"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc/status"
)

// The built-in mesh verifier (I7): after every read-back passed, each
// sampled pair A→B must show, on A's ProbeStats, a probe answered that A
// sent after both A and B had flipped. Probes are round trips, so one
// answered probe proves the overlay both ways between the two nodes on the
// new port; A's own clock stamps it, so the one conversion needed is of
// the flip instants into A's clock (the offsets measured in preflight).

// Verify polls the senders' ProbeStats every few probe intervals
// until every sampled pair passed or the budget (at most until ctx ends)
// is spent. Pairs dark before the change are flagged in the report's
// warnings and do not fail the operation.
func (c *Mesh) Verify(ctx context.Context, op *opstate.Op) error {
	op.Mu.Lock()
	pairs := slices.Clone(op.ProbePairs)
	flips := map[string]probemesh.Flip{}
	for n, f := range op.FlipsLocked() {
		flips[n] = probemesh.Flip{Flipped: f[0], Offset: time.Duration(f[1])}
	}
	for n, s := range op.Offsets {
		f := flips[n]
		f.Offset, f.RTT = s.Offset, s.RTT
		flips[n] = f
	}
	planned := op.ProbePlanned
	// The Verify step's figures serve the first round once: a later
	// batch's verify reads its own.
	first := op.VerifyStats
	op.VerifyStats = nil
	op.Mu.Unlock()
	if !planned {
		// A resumed run: the sample of the run that prepared is not
		// journaled, but the agents probe it since their Prepare.
		stats, _, _, _ := c.readMesh(ctx, op.Nodes)
		for _, n := range slices.Sorted(maps.Keys(stats)) {
			for _, t := range slices.Sorted(maps.Keys(stats[n])) {
				pairs = append(pairs, probemesh.Pair{From: n, To: t})
			}
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	budget := c.budget
	if budget <= 0 {
		budget = config.Default().VerifyBudget
	}
	// Each round reads only the senders of pairs not yet passed or
	// known dark before the change: at 10,000 nodes one read of every
	// sender takes seconds on a small coordinator, and rereading the
	// passed ones each round made the reads of the rest time out.
	// The budget counts from the end of the first round, the
	// one that reads every sender: it bounds the wait for probes, not
	// the reads' own time.
	verdict := map[probemesh.Pair]probemesh.Verdict{}
	why := map[probemesh.Pair]string{}
	// By set, not by scan: 30,000 pairs over 10,000 senders.
	unresolved := func() []string {
		var out []string
		in := map[string]bool{}
		for _, p := range pairs {
			if v, seen := verdict[p]; (!seen || v == probemesh.Dark || v == probemesh.Missing) && !in[p.From] {
				in[p.From] = true
				out = append(out, p.From)
			}
		}
		return out
	}
	var end time.Time
	for senders := unresolved(); len(senders) > 0; {
		stats, intervals, timeouts, errs := c.readMeshAfter(ctx, senders, first)
		first = nil
		if end.IsZero() {
			end = time.Now().Add(budget)
			if dl, ok := ctx.Deadline(); ok {
				end = minTime(end, dl.Add(-50*time.Millisecond))
			}
		}
		read := model.SetOf(senders)
		for _, p := range pairs {
			if !read[p.From] {
				continue
			}
			if e, bad := errs[p.From]; bad {
				verdict[p], why[p] = probemesh.Missing, "not read: "+e
				continue
			}
			st := stats[p.From][p.To]
			verdict[p] = probemesh.JudgePair(st, flips[p.From], flips[p.To], timeouts[p.From])
			switch verdict[p] {
			case probemesh.Dark:
				why[p] = probemesh.DarkWhy(st, flips[p.From], flips[p.To])
			case probemesh.Missing:
				why[p] = "not probed by " + p.From
			}
		}
		if senders = unresolved(); len(senders) == 0 {
			break
		}
		poll := 50 * time.Millisecond
		if iv := slices.Max(append(slices.Collect(maps.Values(intervals)), 0)); iv > 0 {
			poll = min(max(3*iv, 10*time.Millisecond), 500*time.Millisecond)
		}
		if time.Now().Add(poll).After(end) {
			break
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return errors.Join(probemesh.Outcome(pairs, verdict, why).Err(), ctx.Err())
		}
	}
	res := probemesh.Outcome(pairs, verdict, why)
	if len(res.Baseline) > 0 {
		var ps []string
		for _, p := range res.Baseline {
			ps = append(ps, p.String())
		}
		w := fmt.Sprintf("probe mesh: %s never answered, already before the change: not blamed on the cutover, but these pairs are not verified", strings.Join(ps, ", "))
		op.AddWarning(w)
		op.Emit("verify", "", w, false, nil)
	}
	if err := res.Err(); err != nil {
		return err
	}
	op.Emit("verify", "", fmt.Sprintf("probe mesh: %d sampled pair(s) answered probes sent after the flip", len(pairs)-len(res.Baseline)), false, nil)
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// readMesh reads the senders' probe figures (no reset), by sender and
// peer, with each sender's probe interval and timeout; errs names the
// senders that could not be read.
func (c *Mesh) readMesh(ctx context.Context, senders []string) (stats map[string]map[string]*agentv1.PeerProbeStats, intervals, timeouts map[string]time.Duration, errs map[string]string) {
	return c.readMeshAfter(ctx, senders, nil)
}

// readMeshAfter is readMesh where the figures in have been read already
// (the Verify step's): only the other senders are asked.
func (c *Mesh) readMeshAfter(ctx context.Context, senders []string, in map[string]*agentv1.ProbeStatsResponse) (stats map[string]map[string]*agentv1.PeerProbeStats, intervals, timeouts map[string]time.Duration, errs map[string]string) {
	stats = map[string]map[string]*agentv1.PeerProbeStats{}
	intervals, timeouts, errs = map[string]time.Duration{}, map[string]time.Duration{}, map[string]string{}
	add := func(n string, r *agentv1.ProbeStatsResponse) {
		if r.GetAddress() == "" && r.GetOffReason() != "" {
			errs[n] = "probing is off on " + n + ": " + r.GetOffReason()
			return
		}
		byPeer := map[string]*agentv1.PeerProbeStats{}
		for _, p := range r.GetPeers() {
			byPeer[p.GetPeer()] = p
		}
		stats[n] = byPeer
		intervals[n] = time.Duration(r.GetIntervalMicros()) * time.Microsecond
		timeouts[n] = time.Duration(r.GetTimeoutMicros()) * time.Microsecond
	}
	var ask []string
	for _, n := range senders {
		if r, ok := in[n]; ok {
			add(n, r)
		} else {
			ask = append(ask, n)
		}
	}
	var mu sync.Mutex
	fleet.FanOut(ask, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, probeStatsBound)
		defer cancel()
		r, err := c.fleet.Agent(n).Client.ProbeStats(cctx, &agentv1.ProbeStatsRequest{})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs[n] = status.Convert(err).Message()
			return
		}
		add(n, r)
	})
	return stats, intervals, timeouts, errs
}
