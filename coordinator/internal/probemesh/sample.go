package probemesh

import (
	"slices"

	"github.com/cutover-dev/cutover/pkg/ringsample"
)

// Sample is the probe mesh the coordinator hands out with Prepare:
// for every node, the peers it probes. Nodes are taken sorted and set on
// a ring; node i probes the nodes at h = k/2 distances spread evenly
// over the ring's half (1 to its end for h ≥ 2; its middle for h = 1)
// and the same distances the other way, and, for an odd k, the node
// opposite (pkg/ringsample).
// So the sample is symmetric: every node probes exactly those that probe
// it, and two agents probing each other answer inside their own probes
// (one datagram per pair and tick, not two; agent/probe). Both near and
// far pairs of the order are sampled. An odd k over an odd number of
// nodes has no node opposite and no such sample: k+1 is taken. k ≤ 0, or
// k ≥ N-1, is every other node. It does no I/O and depends on nothing but
// its arguments (the same inventory gives the same sample on every
// coordinator).
func Sample(nodes []string, k int) map[string][]string {
	ns := slices.Compact(slices.Sorted(slices.Values(nodes)))
	n := len(ns)
	out := make(map[string][]string, n)
	if n < 2 {
		return out
	}
	dists := ringsample.Distances(n, k)
	for i, from := range ns {
		peers := make([]string, 0, len(dists))
		for _, d := range dists {
			peers = append(peers, ns[(i+d)%n])
		}
		slices.Sort(peers)
		out[from] = peers
	}
	return out
}

// Pair is one sampled ordered pair: From probes To (the round trip
// proves both directions, read on From).
type Pair struct{ From, To string }

func (p Pair) String() string { return p.From + "→" + p.To }

// Pairs lists the pairs of sample whose sender is in from, sorted.
func Pairs(sample map[string][]string, from []string) []Pair {
	var out []Pair
	for _, f := range slices.Sorted(slices.Values(from)) {
		for _, t := range sample[f] {
			out = append(out, Pair{f, t})
		}
	}
	return out
}
