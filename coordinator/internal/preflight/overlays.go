package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc/status"
)

// Subset safety. I1 asks that when an operation ends every
// reachable node of an overlay sends on one port. The atomic strategy
// moves exactly the targeted nodes, so a request that targets part of an
// overlay is safe only when every other node of that overlay already
// sends on the target port (the request then heals a drift). Everything
// else splits the overlay and is a preflight problem.
//
// The staged strategy (docs/staged.md) covers every node of the
// inventory (subsets are refused for it in validate), so this check has
// nothing to find there; staged subsets, when they exist, make every
// untargeted node listen on both ports instead.

// overlayNode is what the split check knows of one inventory node.
type overlayNode struct {
	overlay  string // OverlayName: never empty
	targeted bool
	port     uint32 // current port read back; 0: unknown
	why      string // why port is unknown (unreachable, not read back)
}

// splitProblems returns one problem per overlay the request touches that
// would be left on more than one port: the targeted nodes move to target
// while some untargeted node of the same overlay stays on another port (or
// on a port nobody could read). nodes holds every inventory node. Pure.
func splitProblems(nodes map[string]overlayNode, target tunnelport.Port) []string {
	byOverlay := map[string][]string{}
	touched := map[string]bool{}
	for n, on := range nodes {
		byOverlay[on.overlay] = append(byOverlay[on.overlay], n)
		if on.targeted {
			touched[on.overlay] = true
		}
	}
	var probs []string
	for _, ov := range slices.Sorted(maps.Keys(touched)) {
		members := slices.Sorted(slices.Values(byOverlay[ov]))
		var moving, unknown []string
		stay := map[uint32][]string{}
		for _, n := range members {
			on := nodes[n]
			switch {
			case on.targeted:
				moving = append(moving, n)
			case on.port == 0:
				unknown = append(unknown, fmt.Sprintf("%s (%s)", n, on.why))
			case on.port != target.Wire():
				stay[on.port] = append(stay[on.port], n)
			}
			// An untargeted node already on target is where the moving
			// nodes are going: no split.
		}
		prefix := ""
		if ov != model.DefaultOverlay {
			prefix = "overlay " + ov + ": "
		}
		const fix = "target every node of the overlay"
		if len(stay) > 0 {
			var ports, left []string
			for _, p := range slices.Sorted(maps.Keys(stay)) {
				verb := "stay"
				if len(stay[p]) == 1 {
					verb = "stays"
				}
				ports = append(ports, fmt.Sprintf("%s %s on %d", model.Abbreviate(stay[p], 10), verb, p))
				left = append(left, stay[p]...)
			}
			slices.Sort(left)
			probs = append(probs, fmt.Sprintf("%s%s would move to %d while %s: %s could no longer reach %s over the overlay; %s",
				prefix, model.Abbreviate(moving, 10), target, strings.Join(ports, ", "), model.Abbreviate(moving, 10), model.Abbreviate(left, 10), fix))
		}
		if len(unknown) > 0 {
			probs = append(probs, fmt.Sprintf("%s%s would move to %d, but the port of the rest of the overlay could not be read: %s; %s could be cut off from them: bring their agents back, or %s",
				prefix, model.Abbreviate(moving, 10), target, model.Abbreviate(unknown, 10), model.Abbreviate(moving, 10), fix))
		}
	}
	return probs
}

// overlayProblems is the split check over a preflight: the targeted nodes'
// ports come from it; the untargeted members of the overlays the request
// touches are asked Info (read-only, I3).
func (c *Checker) overlayProblems(ctx context.Context, r Request, p *Result) []string {
	inv := c.fleet.Inventory()
	targeted := map[string]bool{}
	touched := map[string]bool{}
	for _, n := range r.Nodes {
		targeted[n] = true
	}
	for _, a := range inv.Agents {
		if targeted[a.Node] {
			touched[a.OverlayName()] = true
		}
	}
	nodes := map[string]overlayNode{}
	var outside []string
	for _, a := range inv.Agents {
		on := overlayNode{overlay: a.OverlayName(), targeted: targeted[a.Node]}
		if nc := p.Checks[a.Node]; on.targeted && nc != nil && nc.Err == nil {
			on.port = nc.Info.GetCurrentPort()
		}
		if !on.targeted && touched[on.overlay] {
			outside = append(outside, a.Node)
		}
		nodes[a.Node] = on
	}
	if len(outside) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, min(r.Step, 5*time.Second))
	defer cancel()
	var mu sync.Mutex
	fleet.FanOut(outside, func(n string) {
		ac := c.fleet.Agent(n)
		info, err := ac.Client.Info(cctx, &agentv1.InfoRequest{})
		mu.Lock()
		defer mu.Unlock()
		on := nodes[n]
		switch {
		case err != nil:
			on.why = fmt.Sprintf("agent at %s unreachable: %s", ac.Spec.Address, status.Convert(err).Message())
		case info.GetCurrentPort() == 0:
			on.why = "its agent could not read its port: " + orNone(strings.Join(info.GetNotReady(), ", "))
		default:
			on.port = info.GetCurrentPort()
		}
		nodes[n] = on
	})
	return splitProblems(nodes, r.To)
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}
