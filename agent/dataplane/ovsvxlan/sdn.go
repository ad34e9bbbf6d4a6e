package ovsvxlan

// The openshift-sdn profile: what the SDN itself holds for the VXLAN port
// besides vxlan0's dst_port, and what therefore has to carry the new port
// next to the old one for the length of a cutover.
//
//   - filter OPENSHIFT-FIREWALL-ALLOW: -p udp -m udp --dport P -m comment --comment "VXLAN incoming" -j ACCEPT
//   - raw OPENSHIFT-NOTRACK:           -p udp -m udp --dport P -j NOTRACK
//   - br0 table 20:                    priority=300,udp,udp_dst=P actions=drop
//     (pods may not send to the VXLAN port; openshift/sdn
//     pkg/network/node/ovscontroller.go SetupOVS)
//
// The firewall rules are plain templates of dataplane.Firewall; the flow is
// handled by PortFlows, which the backend calls at the same points as the
// firewall (Config.Flows).

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Chains and the drop flow of openshift-sdn, byte for byte as the SDN
// writes them, so that the profile's rules for the old port are the SDN's
// own and finalize recognises them.
const (
	SDNFirewallChain = "OPENSHIFT-FIREWALL-ALLOW"
	SDNNoTrackChain  = "OPENSHIFT-NOTRACK"
	SDNFirewallNote  = "VXLAN incoming"
	// SDNDropTable and SDNDropPriority place the drop flow: table 20 is
	// "from OpenShift container", so only pod traffic to the port drops.
	SDNDropTable    = 20
	SDNDropPriority = 300
)

// SDNFirewallTemplates are the SDN's two port rules (DPort filled per port).
func SDNFirewallTemplates() []iptables.Rule {
	return []iptables.Rule{
		{Table: "filter", Chain: SDNFirewallChain, Proto: "udp", Target: "ACCEPT", Comment: SDNFirewallNote},
		{Table: "raw", Chain: SDNNoTrackChain, Proto: "udp", Target: "NOTRACK"},
	}
}

// SDNDropFlow is the SDN's drop flow for port.
func SDNDropFlow(port tunnelport.Port) openflow.Flow {
	return openflow.Flow{Table: SDNDropTable, Priority: SDNDropPriority,
		Match:   []openflow.Field{{Key: "udp"}, {Key: "udp_dst", Value: strconv.Itoa(int(port))}},
		Actions: "drop"}
}

// PortFlows holds flows whose match carries the VXLAN port: Prepare adds
// them for the new port, Finalize removes the old port's, Abort and Revert
// remove only the new-port flows that were not there before. A nil
// *PortFlows manages nothing.
type PortFlows struct {
	OF     openflow.Interface
	Bridge string
	// Templates are the flows to hold for the port; every match field
	// keyed udp_dst or tp_dst gets the port.
	Templates []openflow.Flow
}

// Flows returns the templates instantiated for port.
func (p *PortFlows) Flows(port tunnelport.Port) []openflow.Flow {
	if p == nil {
		return nil
	}
	out := make([]openflow.Flow, 0, len(p.Templates))
	for _, t := range p.Templates {
		m := make([]openflow.Field, len(t.Match))
		for i, f := range t.Match {
			if f.Key == "udp_dst" || f.Key == "tp_dst" {
				f.Value = strconv.Itoa(int(port))
			}
			m[i] = f
		}
		t.Match = m
		out = append(out, t)
	}
	return out
}

// key identifies a flow the way OpenFlow does: table, priority, match.
func flowKey(f openflow.Flow) string {
	n := f.Normalize()
	return fmt.Sprintf("table=%d,priority=%d,%s", n.Table, n.Priority, n.MatchString())
}

// Present returns, for each flow of port, whether the bridge holds it (same
// table, priority, match and actions), keyed by flowKey.
func (p *PortFlows) Present(ctx context.Context, port tunnelport.Port) (map[string]bool, error) {
	if p == nil {
		return nil, nil
	}
	have, err := p.OF.DumpFlows(ctx, p.Bridge)
	if err != nil {
		return nil, fmt.Errorf("flows: dump %s: %w", p.Bridge, err)
	}
	byKey := map[string]openflow.Flow{}
	for _, f := range have {
		byKey[flowKey(f)] = f
	}
	out := map[string]bool{}
	for _, f := range p.Flows(port) {
		h, ok := byKey[flowKey(f)]
		out[flowKey(f)] = ok && h.Actions == f.Actions
	}
	return out, nil
}

// Add installs every flow of port (OpenFlow add replaces an identical
// match, so a replay is harmless).
func (p *PortFlows) Add(ctx context.Context, port tunnelport.Port) error {
	for _, f := range p.Flows(port) {
		if err := p.OF.AddFlow(ctx, p.Bridge, f); err != nil {
			return fmt.Errorf("flows: add %s on %s: %w", f, p.Bridge, err)
		}
	}
	return nil
}

// Remove deletes the flows of port (strictly: exactly that table, priority
// and match), except those in keep.
func (p *PortFlows) Remove(ctx context.Context, port tunnelport.Port, keep map[string]bool) error {
	for _, f := range p.Flows(port) {
		if keep[flowKey(f)] {
			continue
		}
		if err := p.OF.DelFlowStrict(ctx, p.Bridge, f); err != nil {
			return fmt.Errorf("flows: delete %s on %s: %w", f, p.Bridge, err)
		}
	}
	return nil
}

// Actions describes what Add of to and the later Remove of from will do.
func (p *PortFlows) Actions(from, to tunnelport.Port) (prepare, finalize []string) {
	for _, f := range p.Flows(to) {
		prepare = append(prepare, fmt.Sprintf("ovs-ofctl add-flow %s %s", p.Bridge, f))
	}
	for _, f := range p.Flows(from) {
		finalize = append(finalize, fmt.Sprintf("ovs-ofctl --strict del-flows %s %s", p.Bridge, strings.TrimSuffix(flowKey(f), ",")))
	}
	return prepare, finalize
}

// found reports what the profile will touch as it is now: for each
// firewall template's chain, the rules of from found there, and for each
// port flow, whether the bridge holds the one of from. Problems are things
// that make the cutover unsafe (the bridge unreadable).
func (b *Backend) found(ctx context.Context, from tunnelport.Port) (found, problems []string) {
	if fw := b.cfg.Firewall; fw != nil {
		for _, r := range fw.Rules(from) {
			ok, err := fw.IPT.HasRule(r)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("firewall %s/%s: %v", r.Table, r.Chain, err))
			case ok:
				found = append(found, fmt.Sprintf("found in %s/%s: %s", r.Table, r.Chain, r))
			default:
				found = append(found, fmt.Sprintf("not found in %s/%s: %s (the old port's rule; finalize has nothing to remove there)", r.Table, r.Chain, r))
			}
		}
	}
	if p := b.cfg.Flows; p != nil {
		present, err := p.Present(ctx, from)
		if err != nil {
			problems = append(problems, err.Error())
			return found, problems
		}
		for _, f := range p.Flows(from) {
			if present[flowKey(f)] {
				found = append(found, fmt.Sprintf("found on %s: %s", p.Bridge, f.Normalize().DumpString()))
			} else {
				found = append(found, fmt.Sprintf("not found on %s: %s", p.Bridge, f.Normalize().DumpString()))
			}
		}
	}
	return found, problems
}
