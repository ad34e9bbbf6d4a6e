package lab

import (
	"context"
	"fmt"
	"strings"
)

// BlackholeOverlay makes node's tunnel carry nothing on UDP port: on the
// hub's side of the node's underlay link (ul-<node>) an nftables netdev
// table drops every UDP datagram to port, from the node (ingress) and to
// it (egress). It acts in the kernel's path between the node and the
// underlay switch, not in the node's own netfilter, which OVS's userspace
// datapath bypasses (it sends and receives on eth0 through packet
// sockets). Before a cutover to port it changes nothing, since nothing
// uses port yet; after the flip every overlay pair with node goes dark,
// as behind a middlebox that blocks the new port for this node alone.
func (l *Lab) BlackholeOverlay(ctx context.Context, node string, port int) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	dev := "ul-" + n.Name
	script := fmt.Sprintf(`table netdev %[1]s {
	chain from_node {
		type filter hook ingress device %[2]s priority -10; policy accept;
		udp dport %[3]d drop
	}
	chain to_node {
		type filter hook egress device %[2]s priority -10; policy accept;
		udp dport %[3]d drop
	}
}
`, blackholeTable(n.Name), dev, port)
	if _, err := run(ctx, script, "ip", "netns", "exec", HubNetns(l.Name()), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("lab: blackhole %s udp/%d: %w", node, port, err)
	}
	return nil
}

// ClearBlackhole removes what BlackholeOverlay added for node; clearing a
// node without one is not an error.
func (l *Lab) ClearBlackhole(ctx context.Context, node string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	ns := HubNetns(l.Name())
	out, err := run(ctx, "", "ip", "netns", "exec", ns, "nft", "list", "tables", "netdev")
	if err != nil {
		return fmt.Errorf("lab: clear blackhole %s: %w", node, err)
	}
	if !strings.Contains(out, "table netdev "+blackholeTable(n.Name)+"\n") && !strings.HasSuffix(out, "table netdev "+blackholeTable(n.Name)) {
		return nil
	}
	if _, err := run(ctx, "", "ip", "netns", "exec", ns, "nft", "delete", "table", "netdev", blackholeTable(n.Name)); err != nil {
		return fmt.Errorf("lab: clear blackhole %s: %w", node, err)
	}
	return nil
}

func blackholeTable(node string) string { return "cutover_blackhole_" + node }
