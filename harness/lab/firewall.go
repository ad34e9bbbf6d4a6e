package lab

import (
	"context"
	"fmt"
	"strings"

	"github.com/cutover-dev/cutover/pkg/iptables"
)

// FirewallChain is the chain the lab's nodes accept the overlay port in,
// as OpenShift's node firewall does (OS_FIREWALL_ALLOW), and the agents'
// default --firewall-chain.
const FirewallChain = "OS_FIREWALL_ALLOW"

// PortRule is the iptables-save line of the rule that accepts VXLAN port
// on a node: byte for byte what the agent writes (agent/backend.go
// newFirewall, the field report's form), so that its finalize recognises
// and removes the rule of the port it leaves.
func PortRule(port int) string {
	return iptables.Rule{Table: "filter", Chain: FirewallChain, Proto: "udp", DPort: uint16(port), StateNew: true, Target: "ACCEPT"}.String()
}

// firewallRules is a node's filter table at Up: what arrives on the
// underlay (eth0) as UDP is dropped unless FirewallChain accepts it, and
// the chain accepts the initial VXLAN port (the CNI's own rule). On the
// kernel-vxlan backend this is what makes opening the new port before the
// flip matter (I2, docs/design.md): a node that flips to a port its peers have not
// opened loses every packet to them. On the OVS backend the userspace
// datapath takes the underlay from eth0 before netfilter sees it, so the
// rules only model the firewall's state for the tests to read.
//
// Replies of flows this node started pass (ESTABLISHED), as on any real
// node; the management network (mgmt0) is not filtered.
func firewallRules(port int) string {
	return strings.Join([]string{
		"*filter",
		":INPUT ACCEPT [0:0]",
		":" + FirewallChain + " - [0:0]",
		"-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A INPUT -j " + FirewallChain,
		"-A INPUT -i eth0 -p udp -j DROP",
		PortRule(port),
		"COMMIT",
	}, "\n") + "\n"
}

func setupFirewall(ctx context.Context, n Node, port int) error {
	if _, err := run(ctx, firewallRules(port), "ip", "netns", "exec", n.Netns, "iptables-restore"); err != nil {
		return fmt.Errorf("node %s: firewall: %w", n.Name, err)
	}
	return nil
}

// FirewallRules returns the rules of FirewallChain on node as
// iptables-save lines, read from the node's own iptables.
func (l *Lab) FirewallRules(ctx context.Context, node string) ([]string, error) {
	n, err := l.Node(node)
	if err != nil {
		return nil, err
	}
	out, err := run(ctx, "", "ip", "netns", "exec", n.Netns, "iptables-save", "-t", "filter")
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-A "+FirewallChain+" ") {
			rules = append(rules, line)
		}
	}
	return rules, nil
}

// OpenPortDirect accepts port in node's FirewallChain behind the agent's
// back, the field report's step 3 (open the new port on every node first).
// The baselines of the benchmark use it; ClosePortDirect undoes it.
func (l *Lab) OpenPortDirect(ctx context.Context, node string, port int) error {
	return l.portRule(ctx, node, port, "-A")
}

// ClosePortDirect deletes the rule OpenPortDirect added.
func (l *Lab) ClosePortDirect(ctx context.Context, node string, port int) error {
	return l.portRule(ctx, node, port, "-D")
}

func (l *Lab) portRule(ctx context.Context, node string, port int, op string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	args := append([]string{"ip", "netns", "exec", n.Netns, "iptables", "-t", "filter", op}, strings.Fields(PortRule(port))[1:]...)
	_, err = run(ctx, "", args...)
	return err
}
