package probemesh

import (
	"slices"
)

// Sample is the probe mesh the coordinator hands out with Prepare:
// for every node, the peers it probes. Nodes are taken sorted and set on
// a ring; node i probes the nodes at k distances spread evenly around it
// (1, 1+(N-1)/k, 1+2(N-1)/k, …), so every node sends to exactly k others
// and is probed by exactly k others, and both near and far pairs of the
// order are sampled. k ≤ 0, or k ≥ N-1, is every other node. It does no
// I/O and depends on nothing but its arguments (the same inventory gives
// the same sample on every coordinator).
func Sample(nodes []string, k int) map[string][]string {
	ns := slices.Compact(slices.Sorted(slices.Values(nodes)))
	n := len(ns)
	out := make(map[string][]string, n)
	if n < 2 {
		return out
	}
	if k <= 0 || k > n-1 {
		k = n - 1
	}
	dists := make([]int, k)
	for j := range k {
		// Distinct and within 1..n-1: j*(n-1)/k grows by at least 1 per j
		// because k ≤ n-1.
		dists[j] = 1 + j*(n-1)/k
	}
	for i, from := range ns {
		peers := make([]string, 0, k)
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
