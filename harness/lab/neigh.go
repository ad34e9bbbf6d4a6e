package lab

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// NeighThresh3 is the kernel's hard limit on dynamic IPv4 neighbour entries.
// It is one table for every namespace: all of a lab's nodes share one
// kernel, so their ARP entries count against one limit, where real nodes
// each have their own.
const NeighThresh3 = "/proc/sys/net/ipv4/neigh/default/gc_thresh3"

// neighNeed is how many dynamic neighbour entries a lab of n nodes holds at
// once when every pair talks over the underlay (a full mesh, a path check):
// each node resolves every other node's underlay address. The management
// network adds a few per node; 32-node labs (992 underlay entries against
// the default 1024) come up and run, 64-node ones (4032) do not.
func neighNeed(n int) int { return n * (n - 1) }

// checkNeighbours refuses a lab the kernel's neighbour table cannot hold.
// Past gc_thresh3 the kernel creates no entry: it neither resolves a peer
// nor answers a peer's ARP request (it answers only with an entry for the
// asker), so pairs go dark on both backends and the lab's meshes and
// cutovers fail in ways that look like the product's fault (a 64-node lab
// on a default 1024 lost whole pairs before any change and rolled back an
// OVS cutover for pairs that never carried traffic). read returns
// gc_thresh3; an error reading it skips the check: a kernel or namespace
// without the file has nothing to compare against.
func checkNeighbours(nodes int, read func() (int, error)) error {
	limit, err := read()
	if err != nil {
		return nil
	}
	if need := neighNeed(nodes); need > limit {
		return &ConfigError{"Nodes", strconv.Itoa(nodes), fmt.Sprintf(
			"the lab's nodes share this kernel's neighbour table, which holds at most %d dynamic entries "+
				"(net.ipv4.neigh.default.gc_thresh3) and %d nodes need %d (every node resolving every other); "+
				"past it pairs go dark: raise it (sysctl -w net.ipv4.neigh.default.gc_thresh3=%d "+
				"net.ipv4.neigh.default.gc_thresh2=%d) or use fewer nodes",
			limit, nodes, need, 4*need, 2*need)}
	}
	return nil
}

// readNeighThresh3 reads NeighThresh3.
func readNeighThresh3() (int, error) {
	b, err := os.ReadFile(NeighThresh3)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
