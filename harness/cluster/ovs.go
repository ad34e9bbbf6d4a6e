package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/sdnsim"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// The OVS overlay as openshift-sdn builds it on a node, in userspace
// (datapath_type=netdev: there is no OVS kernel module here): br0 with
// vxlan0 (remote_ip=flow, key=flow) at ofport 1 and tun0 at ofport 2
// holding the node's pod gateway, flows that send a peer's subnet into the
// tunnel towards the peer's node address, the SDN's drop flow and version
// note, and OpenShift's OS_FIREWALL_ALLOW chain jumped to from INPUT (the
// SDN's own chains are its pod's to write: harness/sdnsim). The userspace datapath
// terminates tunnels on an OVS bridge, so the node address moves from
// eth0 to br-ul, which carries eth0: the node's Kubernetes traffic crosses
// OVS too. Its files live at the node's /run/openvswitch, where the agent
// DaemonSet's hostPath finds the OVSDB socket.

// startOVS runs the node's Open vSwitch and builds its bridges. It runs
// before the node's containerd and kubelet, so they start on the node
// address in its final place.
func (n *Node) startOVS(ctx context.Context, port int) error {
	if err := sysctlNS(n.Netns, "net/ipv4/conf/eth0/arp_ignore", "1"); err != nil {
		return err
	}
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: n.HostPath("/run/openvswitch"), Netns: n.Netns})
	if err != nil {
		return err
	}
	n.ovs = inst
	mac := func(kind, i int) string { return fmt.Sprintf("0e:c1:%02x:00:00:%02x", kind, i) }
	if _, err := inst.Vsctl(ctx,
		"--may-exist", "add-br", "br-ul",
		"--", "set", "bridge", "br-ul", "datapath_type=netdev", "other_config:hwaddr="+mac(1, n.Index),
		"--", "--may-exist", "add-port", "br-ul", "eth0",
		"--", "--may-exist", "add-br", "br0",
		"--", "set", "bridge", "br0", "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13", "other_config:hwaddr="+mac(2, n.Index),
		"--", "--may-exist", "add-port", "br0", "vxlan0",
		"--", "set", "interface", "vxlan0", "type=vxlan", "options:remote_ip=flow", "options:key=flow",
		"options:dst_port="+strconv.Itoa(port), "ofport_request=1",
		"--", "--may-exist", "add-port", "br0", "tun0",
		"--", "set", "interface", "tun0", "type=internal", "ofport_request=2", "mtu_request=1450", "mac="+strconv.Quote(mac(3, n.Index)),
	); err != nil {
		return err
	}
	addr := netip.PrefixFrom(n.IP(), NodeNet.Bits()).String()
	if err := ipBatch(n.Netns,
		"addr del "+addr+" dev eth0",
		"addr add "+addr+" dev br-ul",
		"link set br-ul up",
		"route add "+serviceRange()+" dev br-ul",
		"addr add "+netip.PrefixFrom(GatewayIP(n.Index), 24).String()+" dev tun0",
		"link set tun0 up",
		"route add "+PodCIDR.String()+" dev tun0",
	); err != nil {
		return err
	}
	// The kernel leaves TCP checksums to the device; OVS's userspace
	// datapath does not fill them in, so every TCP segment crossing it
	// would arrive broken.
	// The hub's end of eth0's veth too: what the apiserver sends the node
	// reaches OVS through eth0 with its checksum still to be filled in.
	for _, d := range [][2]string{{n.Netns, "br-ul"}, {n.Netns, "tun0"}, {n.Netns, "eth0"}, {n.c.Hub, "v-" + n.Name}} {
		if _, err := run("ip", "netns", "exec", d[0], "ethtool", "-K", d[1], "tx", "off"); err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, err := inst.Appctl(ctx, "ovs/route/add", NodeNet.String(), "br-ul")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	flows := []string{"table=0,priority=100,in_port=1,actions=output:2"}
	for i := 1; i <= n.c.cfg.Nodes; i++ {
		if i == n.Index {
			continue
		}
		for _, m := range []string{"ip,nw_dst=", "arp,arp_tpa="} {
			flows = append(flows, fmt.Sprintf("table=0,priority=100,in_port=2,%s%s,actions=set_field:%s->tun_dst,output:1", m, NodeSubnet(i), NodeIP(i)))
		}
	}
	// What openshift-sdn's setup leaves besides the node's flows: the drop
	// of pod traffic to the VXLAN port (table 20) and the version note it
	// checks to know br0 is already set up (table 253). With them the
	// SDN stand-in, started as a pod, finds the node set up and leaves br0
	// alone, as the real SDN does on a node it set up before.
	flows = append(flows, "table=0,priority=0,actions=drop", sdnsim.DropFlow(uint16(port)),
		fmt.Sprintf("table=%d,actions=note:%s", sdnsim.VersionTable, sdnsim.VersionNote))
	f := filepath.Join(n.Dir(), "br0.flows")
	if err := os.WriteFile(f, []byte(strings.Join(flows, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := inst.Ofctl(ctx, "-O", "OpenFlow13", "replace-flows", "br0", f); err != nil {
		return err
	}
	// OpenShift's host firewall chain, where the agent opens the port.
	for _, r := range []string{"-N OS_FIREWALL_ALLOW", "-I INPUT 1 -j OS_FIREWALL_ALLOW"} {
		if _, err := run(append([]string{"ip", "netns", "exec", n.Netns, "iptables", "-w"}, strings.Fields(r)...)...); err != nil {
			return err
		}
	}
	return nil
}

// OVSPort reads vxlan0's dst_port from the node's own OVSDB (ovs-vsctl),
// not from any agent.
func (n *Node) OVSPort(ctx context.Context) (int, error) {
	if n.ovs == nil {
		return 0, fmt.Errorf("node %s runs no Open vSwitch", n.Name)
	}
	out, err := n.ovs.Vsctl(ctx, "get", "interface", "vxlan0", "options:dst_port")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.Trim(strings.TrimSpace(out), `"`))
}

func sysctlNS(ns, key, value string) error {
	return netns.Do(ns, func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644)
	})
}

// SDNPorts reads, from the node itself, the VXLAN ports openshift-sdn's
// own state names besides vxlan0: the udp_dst of br0's drop flows in table
// 20, and the --dport of the ACCEPT rules in filter
// OPENSHIFT-FIREWALL-ALLOW. A cutover must leave both on the new port
// alone, or the SDN's next resync and a pod's traffic disagree with vxlan0.
func (n *Node) SDNPorts(ctx context.Context) (drop, allow []int, err error) {
	if n.ovs == nil {
		return nil, nil, fmt.Errorf("node %s runs no Open vSwitch", n.Name)
	}
	out, err := n.ovs.Ofctl(ctx, "-O", "OpenFlow13", "dump-flows", "br0", "table=20") // sdnsim.DropFlow's table
	if err != nil {
		return nil, nil, err
	}
	for _, f := range strings.Fields(out) {
		f = strings.TrimSuffix(f, ",")
		for _, part := range strings.Split(f, ",") {
			if v, ok := strings.CutPrefix(part, "tp_dst="); ok {
				part = "udp_dst=" + v
			}
			if v, ok := strings.CutPrefix(part, "udp_dst="); ok {
				p, err := strconv.Atoi(v)
				if err != nil {
					return nil, nil, fmt.Errorf("node %s: br0 table 20 flow %q: %w", n.Name, f, err)
				}
				drop = append(drop, p)
			}
		}
	}
	rules, err := n.Exec(ctx, "iptables", "-w", "5", "-t", "filter", "-S", "OPENSHIFT-FIREWALL-ALLOW")
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(rules, "\n") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "--dport" {
				p, err := strconv.Atoi(f[i+1])
				if err != nil {
					return nil, nil, fmt.Errorf("node %s: OPENSHIFT-FIREWALL-ALLOW rule %q: %w", n.Name, l, err)
				}
				allow = append(allow, p)
			}
		}
	}
	return drop, allow, nil
}
