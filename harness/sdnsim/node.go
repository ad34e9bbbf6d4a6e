package sdnsim

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"sync"

	"github.com/cutover-dev/cutover/pkg/execseam"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovsdb"
)

// OVSNode is a lab node as openshift-sdn sees it: its Open vSwitch (reached
// over unix sockets from any namespace, as the SDN container reaches the
// host's OVS) and its network namespace (iptables, br0's addresses).
type OVSNode struct {
	OVSDir string // OVS_RUNDIR: db.sock and <bridge>.mgmt live there
	Netns  string // the node's network namespace ("" = the caller's)
	// FlowsFile holds the pods' flows (ovs-ofctl syntax, one a line),
	// re-attached at every rebuild.
	FlowsFile string
	Addr      netip.Prefix  // br0's address (the node's pod gateway)
	MTU       int           // br0's MTU, 0: leave
	HWAddr    string        // br0's other_config:hwaddr, "": OVS picks one
	Exec      execseam.Func // nil: execseam.Exec

	mu   sync.Mutex
	db   *ovsdb.Client
	lost chan struct{}
}

const (
	bridge = "br0"
	vxlan  = "vxlan0"
)

func (n *OVSNode) run(ctx context.Context, argv ...string) (string, error) {
	ex := n.Exec
	if ex == nil {
		ex = execseam.Exec
	}
	env := []string{"OVS_RUNDIR=" + n.OVSDir, "OVS_DBDIR=" + n.OVSDir, "OVS_LOGDIR=" + n.OVSDir, "OVS_SYSCONFDIR=" + n.OVSDir}
	out, err := ex(ctx, argv, env)
	return string(out), err
}

// inNetns prefixes argv to run it in the node's namespace.
func (n *OVSNode) inNetns(argv ...string) []string {
	if n.Netns == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", n.Netns}, argv...)
}

func (n *OVSNode) of() *openflow.Client {
	return &openflow.Client{RunDir: n.OVSDir, Exec: n.Exec}
}

// Reconnect implements Node.
func (n *OVSNode) Reconnect(ctx context.Context) error {
	db, err := ovsdb.Dial(ctx, "unix:"+n.OVSDir+"/db.sock")
	if err != nil {
		return err
	}
	n.mu.Lock()
	old := n.db
	n.db = db
	lost := make(chan struct{})
	n.lost = lost
	n.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	go func() {
		<-db.Done()
		close(lost)
	}()
	return nil
}

// Lost implements Node.
func (n *OVSNode) Lost() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lost
}

// Close drops the OVSDB connection.
func (n *OVSNode) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.db == nil {
		return nil
	}
	return n.db.Close()
}

// DstPort implements Node.
func (n *OVSNode) DstPort(ctx context.Context) (uint16, error) {
	n.mu.Lock()
	db := n.db
	n.mu.Unlock()
	if db == nil {
		return 0, fmt.Errorf("ovsdb: not connected")
	}
	res, err := db.Transact(ctx, "Open_vSwitch", ovsdb.Select("Interface", []ovsdb.Condition{ovsdb.Where("name", "==", vxlan)}, "options"))
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return 0, fmt.Errorf("interface %s not found", vxlan)
	}
	opts, err := ovsdb.AsStringMap(res[0].Rows[0]["options"])
	if err != nil {
		return 0, fmt.Errorf("interface %s options: %w", vxlan, err)
	}
	s, ok := opts["dst_port"]
	if !ok {
		return 4789, nil
	}
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("interface %s options:dst_port %q: %w", vxlan, s, err)
	}
	return uint16(p), nil
}

// VersionFlows implements Node.
func (n *OVSNode) VersionFlows(ctx context.Context) ([]string, error) {
	flows, err := n.of().DumpFlows(ctx, bridge)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range flows {
		if f.Table == VersionTable {
			out = append(out, f.Actions)
		}
	}
	return out, nil
}

// DropFlow is openshift-sdn's flow that drops pod traffic to the VXLAN port.
func DropFlow(port uint16) string {
	return fmt.Sprintf("table=20,priority=300,udp,udp_dst=%d,actions=drop", port)
}

// Rebuild implements Node: as openshift-sdn's SetupOVS, br0 is deleted and
// added again in two steps, so everything on it (ports, flows, the LOCAL
// port's device and its address) really goes away, then the pods come
// back.
func (n *OVSNode) Rebuild(ctx context.Context, port uint16) error {
	if _, err := n.run(ctx, "ovs-vsctl", "--if-exists", "del-br", bridge); err != nil {
		return err
	}
	add := []string{"ovs-vsctl", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13"}
	if n.HWAddr != "" {
		add = append(add, "other_config:hwaddr="+n.HWAddr)
	}
	add = append(add, "--", "add-port", bridge, vxlan, "--", "set", "interface", vxlan, "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "options:dst_port="+strconv.Itoa(int(port)), "ofport_request=1")
	if _, err := n.run(ctx, add...); err != nil {
		return err
	}
	// Re-attach the pods: their flows, and the gateway address.
	if n.FlowsFile != "" {
		if _, err := n.run(ctx, "ovs-ofctl", "-O", "OpenFlow13", "add-flows", bridge, n.FlowsFile); err != nil {
			return err
		}
	}
	if _, err := n.run(ctx, "ovs-ofctl", "-O", "OpenFlow13", "add-flow", bridge, DropFlow(port)); err != nil {
		return err
	}
	if n.MTU > 0 {
		if _, err := n.run(ctx, n.inNetns("ip", "link", "set", bridge, "mtu", strconv.Itoa(n.MTU))...); err != nil {
			return err
		}
	}
	if n.Addr.IsValid() {
		if _, err := n.run(ctx, n.inNetns("ip", "addr", "replace", n.Addr.String(), "dev", bridge)...); err != nil {
			return err
		}
	}
	_, err := n.run(ctx, n.inNetns("ip", "link", "set", bridge, "up")...)
	return err
}

// FinishSetup implements Node.
func (n *OVSNode) FinishSetup(ctx context.Context, note string) error {
	_, err := n.run(ctx, "ovs-ofctl", "-O", "OpenFlow13", "add-flow", bridge, fmt.Sprintf("table=%d,actions=note:%s", VersionTable, note))
	return err
}

// chainSpec is one of the SDN's chains: where it is jumped to from, and
// its rules (iptables argv after the chain name).
type chainSpec struct {
	table, name string
	from        []string
	jumpComment string
	rules       [][]string
}

func sdnChains(port uint16) []chainSpec {
	p := strconv.Itoa(int(port))
	return []chainSpec{
		{table: "filter", name: "OPENSHIFT-FIREWALL-ALLOW", from: []string{"INPUT"}, jumpComment: "firewall overrides",
			rules: [][]string{{"-p", "udp", "-m", "udp", "--dport", p, "-m", "comment", "--comment", "VXLAN incoming", "-j", "ACCEPT"}}},
		{table: "raw", name: "OPENSHIFT-NOTRACK", from: []string{"PREROUTING", "OUTPUT"}, jumpComment: "disable conntrack for vxlan",
			rules: [][]string{{"-p", "udp", "-m", "udp", "--dport", p, "-j", "NOTRACK"}}},
	}
}

// SyncFirewall implements Node with openshift-sdn's semantics
// (syncIPTableRules): ensure the chain and the jump to it, append missing
// rules, and when the chain existed but lacked one of them, flush it and
// add them again.
func (n *OVSNode) SyncFirewall(ctx context.Context, port uint16) error {
	ipt := func(args ...string) (string, error) {
		return n.run(ctx, n.inNetns(append([]string{"iptables", "-w", "5"}, args...)...)...)
	}
	for _, c := range sdnChains(port) {
		_, err := ipt("-t", c.table, "-S", c.name)
		existed := err == nil
		if !existed {
			if _, err := ipt("-t", c.table, "-N", c.name); err != nil {
				return err
			}
		}
		for _, from := range c.from {
			jump := []string{from, "-m", "comment", "--comment", c.jumpComment, "-j", c.name}
			if _, err := ipt(append([]string{"-t", c.table, "-C"}, jump...)...); err != nil {
				if _, err := ipt(append([]string{"-t", c.table, "-I", from, "1"}, jump[1:]...)...); err != nil {
					return err
				}
			}
		}
		ensure := func() (all bool, err error) {
			all = true
			for _, r := range c.rules {
				if _, err := ipt(append([]string{"-t", c.table, "-C", c.name}, r...)...); err == nil {
					continue
				}
				all = false
				if _, err := ipt(append([]string{"-t", c.table, "-A", c.name}, r...)...); err != nil {
					return false, err
				}
			}
			return all, nil
		}
		all, err := ensure()
		if err != nil {
			return err
		}
		if existed && !all {
			if _, err := ipt("-t", c.table, "-F", c.name); err != nil {
				return err
			}
			if _, err := ensure(); err != nil {
				return err
			}
		}
	}
	return nil
}
