package lab

import (
	"context"
	"fmt"
	"strings"
)

// UnderlayFilter is an NSX-like middlebox in the lab's underlay: nftables
// rules on the hub's side of the nodes' underlay links (ul-<node>, the
// netdev ingress hook: frames as they leave a node), so they act on OVS's
// userspace datapath and kernel VXLAN alike. Zero fields add nothing.
type UnderlayFilter struct {
	// Port is the UDP destination port the rules match.
	Port int
	// Between drops every datagram to Port between these two nodes, both
	// ways (a firewall that blocks the port for one pair).
	Between [2]string
	// BetweenAlso are more ports Between drops (the current port, say:
	// a pair whose underlay is down altogether).
	BetweenAlso []int
	// VNI, when VNISet, drops only VXLAN frames to Port whose VNI is VNI,
	// between every pair (a middlebox inspecting VXLAN, flannel#2388).
	VNI    uint32
	VNISet bool
	// Above drops datagrams to Port whose IPv4 packet is longer than
	// Above bytes, between every pair (an MTU black hole: no ICMP).
	Above int
}

func filterTable() string { return "cutover_nsx" }

// script is the nft script of f on the lab's nodes.
func (f UnderlayFilter) script(l *Lab) (string, error) {
	if f.Port < 1 || f.Port > 65535 {
		return "", fmt.Errorf("lab: underlay filter: port %d: want 1-65535", f.Port)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n", filterTable())
	for _, n := range l.Nodes() {
		var rules []string
		if f.Between[0] != "" {
			a, err := l.Node(f.Between[0])
			if err != nil {
				return "", err
			}
			c, err := l.Node(f.Between[1])
			if err != nil {
				return "", err
			}
			for _, p := range [][2]Node{{a, c}, {c, a}} {
				if p[0].Name == n.Name {
					for _, port := range append([]int{f.Port}, f.BetweenAlso...) {
						rules = append(rules, fmt.Sprintf("ip saddr %s ip daddr %s udp dport %d drop", p[0].UnderlayIP, p[1].UnderlayIP, port))
					}
				}
			}
		}
		if f.VNISet {
			// RFC 7348: the VNI is the 24 bits after the UDP header's 8
			// bytes and the VXLAN flags' 4: bits 96–119 of the transport
			// header.
			rules = append(rules, fmt.Sprintf("udp dport %d @th,96,24 %d drop", f.Port, f.VNI))
		}
		if f.Above > 0 {
			rules = append(rules, fmt.Sprintf("udp dport %d ip length > %d drop", f.Port, f.Above))
		}
		if len(rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\tchain from_%s {\n\t\ttype filter hook ingress device ul-%s priority -20; policy accept;\n", n.Name, n.Name)
		for _, r := range rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// FilterUnderlay installs f in the hub, replacing an earlier filter.
func (l *Lab) FilterUnderlay(ctx context.Context, f UnderlayFilter) error {
	script, err := f.script(l)
	if err != nil {
		return err
	}
	if err := l.ClearUnderlayFilter(ctx); err != nil {
		return err
	}
	if _, err := run(ctx, script, "ip", "netns", "exec", HubNetns(l.Name()), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("lab: underlay filter %+v: %w\n%s", f, err, script)
	}
	return nil
}

// UnderlayFilterRules is the filter in the hub as nft lists it, with its
// counters (empty: none).
func (l *Lab) UnderlayFilterRules(ctx context.Context) (string, error) {
	out, err := run(ctx, "", "ip", "netns", "exec", HubNetns(l.Name()), "nft", "list", "tables", "netdev")
	if err != nil || !strings.Contains(out, filterTable()) {
		return "", err
	}
	return run(ctx, "", "ip", "netns", "exec", HubNetns(l.Name()), "nft", "list", "table", "netdev", filterTable())
}

// ClearUnderlayFilter removes the filter; none is not an error.
func (l *Lab) ClearUnderlayFilter(ctx context.Context) error {
	out, err := run(ctx, "", "ip", "netns", "exec", HubNetns(l.Name()), "nft", "list", "tables", "netdev")
	if err != nil {
		return fmt.Errorf("lab: clear underlay filter: %w", err)
	}
	if !strings.Contains(out, "table netdev "+filterTable()) {
		return nil
	}
	if _, err := run(ctx, "", "ip", "netns", "exec", HubNetns(l.Name()), "nft", "delete", "table", "netdev", filterTable()); err != nil {
		return fmt.Errorf("lab: clear underlay filter: %w", err)
	}
	return nil
}
