package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// The kernel-VXLAN overlay as flannel's vxlan backend builds it, written by
// the harness where flanneld does not run: flannel.1 (VNI 1, nolearning)
// on eth0, the node's pod gateway on cni0, and per peer a permanent
// neighbour, an FDB entry to its node address and an onlink route to its
// subnet.

// FlannelIP is node i's flannel.1 address (the first of its subnet, /32).
func FlannelIP(i int) netip.Addr { return NodeSubnet(i).Addr() }

// GatewayIP is node i's cni0 address, the target of the traffic ring.
func GatewayIP(i int) netip.Addr { return NodeSubnet(i).Addr().Next() }

// FlannelMAC is node i's flannel.1 MAC.
func FlannelMAC(i int) string { return fmt.Sprintf("0e:c0:00:00:00:%02x", i) }

// KernelOverlay builds every node's flannel-style overlay on port.
func (c *Cluster) KernelOverlay(ctx context.Context, port int) error {
	for _, n := range c.Nodes {
		if err := n.KernelDevice(ctx, port, true); err != nil {
			return err
		}
	}
	return nil
}

// KernelDevice (re)creates the node's flannel.1 on port with its peers'
// entries, as flanneld does at start; first also makes cni0.
func (n *Node) KernelDevice(ctx context.Context, port int, first bool) error {
	lines := []string{}
	if first {
		lines = append(lines,
			"link add cni0 type bridge",
			"addr add "+netip.PrefixFrom(GatewayIP(n.Index), 24).String()+" dev cni0",
			"link set cni0 up")
	} else {
		lines = append(lines, "link del flannel.1")
	}
	lines = append(lines,
		fmt.Sprintf("link add flannel.1 address %s type vxlan id 1 local %s dev eth0 dstport %d nolearning", FlannelMAC(n.Index), n.IP(), port),
		"link set flannel.1 mtu 1450",
		"addr add "+FlannelIP(n.Index).String()+"/32 dev flannel.1",
		"link set flannel.1 up")
	for _, p := range n.c.Nodes {
		if p.Index == n.Index {
			continue
		}
		lines = append(lines,
			fmt.Sprintf("neigh replace %s lladdr %s dev flannel.1 nud permanent", FlannelIP(p.Index), FlannelMAC(p.Index)),
			fmt.Sprintf("route replace %s via %s dev flannel.1 onlink", NodeSubnet(p.Index), FlannelIP(p.Index)))
	}
	if err := ipBatch(n.Netns, lines...); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	for _, p := range n.c.Nodes {
		if p.Index == n.Index {
			continue
		}
		if _, err := run("bridge", "-n", n.Netns, "fdb", "replace", FlannelMAC(p.Index), "dev", "flannel.1", "dst", p.IP().String(), "self", "permanent"); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

var dstportRE = regexp.MustCompile(`dstport (\d+)`)

// KernelPort reads the VXLAN port of the node's flannel.1 from the kernel
// (ip -d link), not from any agent.
func (n *Node) KernelPort(ctx context.Context) (int, error) {
	out, err := run("ip", "-n", n.Netns, "-d", "link", "show", "flannel.1")
	if err != nil {
		return 0, err
	}
	m := dstportRE.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("node %s: no dstport in %q", n.Name, strings.TrimSpace(out))
	}
	return strconv.Atoi(m[1])
}
