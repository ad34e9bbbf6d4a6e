package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/dataplane/kernelvxlan"
	"github.com/cutover-dev/cutover/agent/dataplane/ovsvxlan"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/nftables"
	"github.com/cutover-dev/cutover/pkg/openflow"
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
	var flows *ovsvxlan.PortFlows
	if cfg.Profile == ProfileOpenShiftSDN {
		flows = openshiftSDN(cfg, fw)
	}
	local, _ := underlayAddr(cfg) // none: the staged strategy is refused, saying why
	return ovsvxlan.New(ovsvxlan.Config{OVS: drv, Interface: cfg.Interface, Bridge: cfg.Bridge, Firewall: fw, Ports: ports, Flows: flows,
		OF: &openflow.Client{RunDir: ovsRunDir(cfg)}, SDN: cfg.Profile == ProfileOpenShiftSDN, RxLocalIP: local,
		StandingRedirects: cfg.StandingRedirects})
}

// ovsRunDir is OVS_RUNDIR for ovs-ofctl: the directory of the OVSDB
// socket, where ovs-vswitchd's <bridge>.mgmt lives too ("" for the
// default, /var/run/openvswitch).
func ovsRunDir(cfg Config) string {
	if strings.HasPrefix(cfg.OVSDB, "unix:") {
		return filepath.Dir(strings.TrimPrefix(cfg.OVSDB, "unix:"))
	}
	return ""
}

// openshiftSDN wires the openshift-sdn profile: the SDN's two port rules
// join the firewall templates, and br0's drop flow is handled through
// ovs-ofctl on the bridge's management socket, which lives in the same
// run directory as the OVSDB socket (OVS_RUNDIR).
func openshiftSDN(cfg Config, fw *dataplane.Firewall) *ovsvxlan.PortFlows {
	fw.Templates = append(fw.Templates, ovsvxlan.SDNFirewallTemplates()...)
	return &ovsvxlan.PortFlows{
		OF:        &openflow.Client{RunDir: ovsRunDir(cfg)},
		Bridge:    cfg.Bridge,
		Templates: []openflow.Flow{ovsvxlan.SDNDropFlow(0)},
	}
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
		JumpFrom:    "INPUT", // local delivery: the tunnel's UDP packets are for the node itself
		NFT:         &nftables.Client{},
		NFTMode:     cfg.NFTables,
		Templates: []iptables.Rule{{
			Table: cfg.FirewallTable, Chain: cfg.FirewallChain, Proto: "udp",
			StateNew: cfg.StateNewMatch, Target: "ACCEPT",
			// No comment: the rule must be byte-identical to the one an
			// operator or the SDN wrote for the old port, so finalize
			// recognises and removes it.
		}},
	}, nil
}

// probeInterface is the interface whose IPv4 is the node's overlay address,
// per backend: OVS (openshift-sdn) routes the node's own overlay traffic
// through its gateway port tun0, which holds the node's first pod-subnet
// address; a kernel VXLAN CNI (flannel.1, vxlan.calico) puts the node's
// tunnel address on the VXLAN device itself. --probe-interface overrides.
func probeInterface(cfg Config) string {
	switch {
	case cfg.ProbeInterface != "":
		return cfg.ProbeInterface
	case cfg.Backend == BackendKernelVXLAN:
		return cfg.KernelDevice
	}
	return DefaultOVSProbeInterface
}
