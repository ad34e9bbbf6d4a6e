package preflight

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/probemesh"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// ProbePlan is the probe mesh of one operation, chosen in preflight: the
// peers each target is sent with Prepare and the pairs verify checks.
type ProbePlan struct {
	Peers    map[string][]*agentv1.ProbePeer // by target
	Pairs    []probemesh.Pair                // sampled pairs whose sender is a target
	Warnings []string                        // why the result cannot be a clean success
	Notes    []string                        // for the operation's events only
	Problems []string                        // preflight refuses the cutover
}

// PlanProbes collects every agent's probe address, the whole inventory's
// (a target's overlay reaches nodes outside the targets too), and samples
// the mesh: every probed node probes --probe-peers-k others, the same
// that probe it (probemesh.Sample). A target without a probe address is a preflight problem naming
// its probe_off_reason, unless the request accepts an unverified result
// (allow_unprobed: it is left out and the result flagged). A node outside
// the targets that has none, or does not answer, is left out of the mesh
// with a note: the operation does not touch it. It changes nothing (I3).
func (c *Checker) PlanProbes(ctx context.Context, r Request, checks map[string]*NodeCheck) *ProbePlan {
	pp := &ProbePlan{Peers: map[string][]*agentv1.ProbePeer{}}
	if c.cfg.NoProbeVerify {
		pp.Warnings = append(pp.Warnings, "probe mesh verification is off (--probe-verify=false): the overlay was not verified after the change")
		return pp
	}
	infos := map[string]*agentv1.InfoResponse{}
	why := map[string]string{}
	var others []string
	targeted := model.SetOf(r.Nodes)
	candidates := c.probeCandidates(r)
	for _, n := range candidates {
		if nc, ok := checks[n]; ok {
			if nc.Err == nil {
				infos[n] = nc.Info
			} else {
				why[n] = "unreachable"
			}
			continue
		}
		others = append(others, n)
	}
	var mu sync.Mutex
	cctx, cancel := context.WithTimeout(ctx, min(r.Step, 2*time.Second))
	defer cancel()
	fleet.FanOut(others, func(n string) {
		info, err := c.fleet.Agent(n).Client.Info(cctx, &agentv1.InfoRequest{})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			why[n] = "unreachable"
			return
		}
		infos[n] = info
	})
	addrs := map[string]string{}
	var unprobed []string
	for _, n := range candidates {
		info := infos[n]
		if info != nil && info.GetProbeAddress() != "" {
			addrs[n] = info.GetProbeAddress()
			continue
		}
		if info != nil {
			why[n] = "probing off: " + orUnknown(info.GetProbeOffReason())
		}
		if !targeted[n] {
			pp.Notes = append(pp.Notes, fmt.Sprintf("%s (not a target) left out of the probe mesh: %s", n, why[n]))
			continue
		}
		if info == nil {
			continue // unreachable: already a preflight problem
		}
		if !r.AllowUnprobed {
			pp.Problems = append(pp.Problems, fmt.Sprintf("%s: no probe address (%s): the overlay through it cannot be verified after the change (I7); fix the agent's probe mesh (its --probe-listen, its overlay address), or set allow_unprobed (coordctl --allow-unprobed) to accept a flagged result", n, why[n]))
			continue
		}
		unprobed = append(unprobed, fmt.Sprintf("%s (%s)", n, why[n]))
	}
	if len(unprobed) > 0 {
		pp.Warnings = append(pp.Warnings, "not verified by the probe mesh (allow_unprobed): "+strings.Join(unprobed, ", "))
	}
	var probed []string
	for n := range addrs {
		probed = append(probed, n)
	}
	sample := probemesh.Sample(probed, c.cfg.ProbePeersK)
	var senders []string
	for _, n := range r.Nodes {
		if _, ok := addrs[n]; !ok {
			continue
		}
		senders = append(senders, n)
		for _, p := range sample[n] {
			pp.Peers[n] = append(pp.Peers[n], &agentv1.ProbePeer{Name: p, Address: addrs[p]})
		}
	}
	pp.Pairs = probemesh.Pairs(sample, senders)
	return pp
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// probeCandidates are the nodes the sample is drawn from: every node of
// the targets' overlays, targeted or not (a subset that joins nodes already
// on the target port must be verified against them), and no node of
// another overlay, which the changed tunnel does not reach.
func (c *Checker) probeCandidates(r Request) []string {
	inv := c.fleet.Inventory()
	// A set, not a scan of r.nodes per agent: 10,000 × 10,000 compares
	// were a quarter of a second of preflight.
	targeted := model.SetOf(r.Nodes)
	overlays := map[string]bool{}
	for _, a := range inv.Agents {
		if targeted[a.Node] {
			overlays[a.OverlayName()] = true
		}
	}
	var out []string
	for _, a := range inv.Agents {
		if overlays[a.OverlayName()] {
			out = append(out, a.Node)
		}
	}
	return out
}
