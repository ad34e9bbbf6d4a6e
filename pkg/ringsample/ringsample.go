// Package ringsample is the shape of the probe mesh's sample, shared by
// the coordinator (which hands each node its peers) and the lab (which
// starts agents with static peers): nodes set on a ring, each probing
// the nodes at the same distances both ways, so that every node probes
// exactly the nodes that probe it. Two agents probing each other put
// their answers in their own probes (agent/probe): one datagram per pair
// and tick, not two.
package ringsample

import "slices"

// Distances are the ring distances a node probes at over n nodes, for
// k peers: a set closed under d → n-d, of k distances (k+1
// for odd k and n), all of 1..n-1 for k ≤ 0 or k ≥ n-1.
func Distances(n, k int) []int {
	if n < 2 {
		return nil
	}
	if k <= 0 || k >= n-1 {
		k = n - 1
	}
	if k%2 == 1 && n%2 == 1 {
		k++ // ≤ n-1: k < n-1 here, and n-1 is even
	}
	half := (n - 1) / 2 // distances d < n-d
	h := k / 2          // ≤ half: k ≤ n-1, and n even for an odd k
	dists := make([]int, 0, k)
	for j := range h {
		// Spread over 1..half, both ends taken from two on: a node's
		// neighbours and its far side are both sampled. One distance is
		// the middle one, not 1: with neighbours alone a change made node
		// by node in ring order (the field report's loop over the nodes)
		// splits only the pairs at its front, and the mesh would measure
		// far less of it than a cluster's traffic sees.
		d := (1 + half) / 2
		if h > 1 {
			d = 1 + j*(half-1)/(h-1) // distinct: the step is at least 1, as h ≤ half
		}
		dists = append(dists, d, n-d)
	}
	if k%2 == 1 {
		dists = append(dists, n/2)
	}
	slices.Sort(dists)
	return dists
}
