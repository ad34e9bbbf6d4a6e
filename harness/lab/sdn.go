package lab

// OpenShift SDN stand-ins for an OVS lab (package sdnsim): one sdnsim
// process per node, supervised as the pods of the openshift-sdn/sdn
// DaemonSet on a real kube-apiserver.
//
// The stand-ins run in the host namespace, not in the nodes': the test
// apiserver listens on the host's loopback, which a node namespace cannot
// reach, and a node's Open vSwitch is reached over its unix sockets (OVSDB
// and br0.mgmt), which cross namespaces, as the real SDN container reaches
// the host's OVS. iptables and ip run inside the node's namespace.

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/cutover-dev/cutover/harness/sdnsim"
)

// SDNConfig says how to run the stand-ins.
type SDNConfig struct {
	Bin            string // the sdnsim binary
	Kubeconfig     string // of the apiserver holding the ClusterNetwork
	Client         kubernetes.Interface
	HealthInterval time.Duration
	// NoHealthCheckImages are the images that run the stand-in with
	// --no-health-check (the field report's patched image).
	NoHealthCheckImages []string
}

var mtuRE = regexp.MustCompile(`\bmtu (\d+)\b`)

// SDNCommand returns the command line of node's stand-in running image.
// br0's MAC and MTU are read from the node now, so a rebuild puts back
// what the lab built.
func (l *Lab) SDNCommand(ctx context.Context, cfg SDNConfig, node, image string) (*exec.Cmd, error) {
	n, err := l.Node(node)
	if err != nil {
		return nil, err
	}
	inst := l.OVS(node)
	if inst == nil {
		return nil, fmt.Errorf("node %s: the SDN stand-in needs the %s backend", node, BackendOVS)
	}
	hw, err := inst.Vsctl(ctx, "--no-wait", "get", "bridge", "br0", "other_config:hwaddr")
	if err != nil {
		return nil, err
	}
	out, err := l.Exec(ctx, node, "ip", "-o", "link", "show", "br0")
	if err != nil {
		return nil, err
	}
	m := mtuRE.FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("node %s: no mtu in %q", node, out)
	}
	args := []string{
		"--node", node, "--kubeconfig", cfg.Kubeconfig, "--ovs-dir", n.OVSDir, "--netns", n.Netns,
		"--flows-file", filepath.Join(n.Dir, "br0.flows"),
		"--addr", netip.PrefixFrom(n.OverlayIP, OverlayNet.Bits()).String(),
		"--hwaddr", strings.Trim(strings.TrimSpace(hw), `"`), "--mtu", m[1],
		"--health-interval", cfg.HealthInterval.String(),
	}
	for _, img := range cfg.NoHealthCheckImages {
		if img == image {
			args = append(args, "--no-health-check")
		}
	}
	return exec.Command(cfg.Bin, args...), nil
}

// StartSDN starts the SDN stand-ins' supervisor for every node of the lab
// (the DaemonSet must exist on the apiserver) and returns it running; the
// caller stops it (Stop) before Down. Their stderr goes to
// <dir>/sdn-<node>.log.
func (l *Lab) StartSDN(ctx context.Context, cfg SDNConfig) (*sdnsim.Supervisor, error) {
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = sdnsim.DefaultHealthInterval
	}
	var nodes []string
	cmds := map[string]map[string]*exec.Cmd{}
	for _, n := range l.Nodes() {
		nodes = append(nodes, n.Name)
		cmds[n.Name] = map[string]*exec.Cmd{}
	}
	// Read each node's br0 details once, before any stand-in can delete
	// br0, and build command lines from them.
	proto := map[string]*exec.Cmd{}
	for _, n := range nodes {
		c, err := l.SDNCommand(ctx, cfg, n, "")
		if err != nil {
			return nil, err
		}
		proto[n] = c
	}
	command := func(node, image string) *exec.Cmd {
		args := append([]string(nil), proto[node].Args[1:]...)
		args = slices.DeleteFunc(args, func(a string) bool { return a == "--no-health-check" })
		for _, img := range cfg.NoHealthCheckImages {
			if img == image {
				args = append(args, "--no-health-check")
			}
		}
		return exec.Command(cfg.Bin, args...)
	}
	s, err := sdnsim.NewSupervisor(sdnsim.SupervisorConfig{Client: cfg.Client, Nodes: nodes, Command: command, LogDir: l.Dir()})
	if err != nil {
		return nil, err
	}
	s.Start(context.WithoutCancel(ctx))
	return s, nil
}

// Ports reads every node's VXLAN port from its dataplane, as "n1=4889
// n2=4889 ...".
func (l *Lab) Ports(ctx context.Context) (string, error) {
	var parts []string
	for _, n := range l.Nodes() {
		p, err := l.Port(ctx, n.Name)
		if err != nil {
			return "", err
		}
		parts = append(parts, n.Name+"="+strconv.Itoa(p))
	}
	return strings.Join(parts, " "), nil
}
