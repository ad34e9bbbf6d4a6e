package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/dataplane/kernelvxlan"
	"github.com/cutover-dev/cutover/agent/dataplane/ovsvxlan"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

// NewBackend builds the dataplane backend cfg asks for. It is the one place
// where backends are chosen and constructed from flags. Run retries it
// every --backend-retry while it fails (OVS may start after the agent), so
// an error must say what is missing.
func NewBackend(cfg Config) (dataplane.Backend, error) {
	switch cfg.Backend {
	case BackendOVS, BackendKernelVXLAN:
	default:
		return nil, fmt.Errorf("--backend %q: unknown backend: want %s or %s", cfg.Backend, BackendOVS, BackendKernelVXLAN)
	}
	fw, err := newFirewall(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Backend == BackendKernelVXLAN {
		b, _, err := kernelvxlan.Open("", kernelvxlan.Config{Device: cfg.KernelDevice, Firewall: fw}, cfg.ConntrackCleanup)
		if err != nil {
			return nil, fmt.Errorf("backend %s (device %s): %w", cfg.Backend, cfg.KernelDevice, err)
		}
		return b, nil
	}
	drv, err := ovs.New(ovs.Config{Addr: cfg.OVSDB}.Default())
	if err != nil {
		return nil, fmt.Errorf("backend %s: --ovsdb %q: %w", cfg.Backend, cfg.OVSDB, err)
	}
	// The port check is best effort on an OVS node: a userspace datapath
	// holds no kernel socket for its tunnel port, a kernel datapath holds
	// one in the node's namespace, which this sees.
	ports, err := udpport.Open("")
	if err != nil {
		return nil, fmt.Errorf("backend %s: port checker: %w", cfg.Backend, err)
	}
	return ovsvxlan.New(ovsvxlan.Config{OVS: drv, Interface: cfg.Interface, Firewall: fw, Ports: ports})
}

// newFirewall builds the firewall the port is opened in: one ACCEPT rule in
// --firewall-chain (OS_FIREWALL_ALLOW by default, as in the field report).
func newFirewall(cfg Config) (*dataplane.Firewall, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ipt, err := iptables.New(ctx, iptables.Config{Backend: cfg.IptablesBackend})
	if err != nil {
		return nil, fmt.Errorf("firewall (--iptables-backend %q): %w", cfg.IptablesBackend, err)
	}
	return &dataplane.Firewall{
		IPT:         ipt,
		CreateChain: cfg.CreateChain,
		Templates: []iptables.Rule{{
			Table: cfg.FirewallTable, Chain: cfg.FirewallChain, Proto: "udp",
			StateNew: cfg.StateNewMatch, Target: "ACCEPT",
			// No comment: the rule must be byte-identical to the one an
			// operator or the SDN wrote for the old port, so finalize
			// recognises and removes it.
		}},
	}, nil
}
