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
		// Distinct and within 1..half: j*half/h grows by at least 1 per j.
		d := 1 + j*half/h
		dists = append(dists, d, n-d)
	}
	if k%2 == 1 {
		dists = append(dists, n/2)
	}
	slices.Sort(dists)
	return dists
}
