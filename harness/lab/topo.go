package lab

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
	"github.com/cutover-dev/cutover/pkg/netns"
)

// hubLines builds the hub's two bridges. STP stays off (the default) so a
// port forwards as soon as it is up; multicast snooping is off because
// nothing here needs it and it only delays first packets.
func hubLines() []string {
	return []string{
		"link add ul type bridge mcast_snooping 0",
		"link add mg type bridge mcast_snooping 0",
		"addr add " + pfx(HubUnderlay, UnderlayNet) + " dev ul",
		"addr add " + pfx(HubMgmt, MgmtNet) + " dev mg",
		"link set ul up",
		"link set mg up",
	}
}

// hubVethLines creates node n's two veth pairs from the hub side, moving the
// node ends (eth0, mgmt0) into the node's namespace in the same step.
func hubVethLines(n Node) []string {
	ul, mg := "ul-"+n.Name, "mg-"+n.Name
	return []string{
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", ul, n.Netns),
		fmt.Sprintf("link add %s type veth peer name mgmt0 netns %s", mg, n.Netns),
		fmt.Sprintf("link set %s master ul up", ul),
		fmt.Sprintf("link set %s master mg up", mg),
	}
}

// nodeBaseLines brings up the node's kernel-only management path.
func nodeBaseLines(n Node) []string {
	return []string{
		"addr add " + pfx(n.MgmtIP, MgmtNet) + " dev mgmt0",
		"link set mgmt0 up",
		"link set eth0 up",
	}
}

// pfx is address a with the prefix length of net p ("198.18.0.11/17").
func pfx(a netip.Addr, p netip.Prefix) string {
	return netip.PrefixFrom(a, p.Bits()).String()
}

// ovsBridgeArgs is the one ovs-vsctl transaction that builds a node's two
// bridges. br0 mirrors OpenShift SDN's: fail_mode=secure (nothing passes
// until flows say so), OpenFlow13 only, vxlan0 at ofport 1 with
// remote_ip=flow and key=flow so flows pick the peer per packet.
func ovsBridgeArgs(n Node, port int) []string {
	return []string{
		"--may-exist", "add-br", "br-ul",
		"--", "set", "bridge", "br-ul", "datapath_type=netdev", "other_config:hwaddr=" + mac(macBrUL, n.Index),
		"--", "--may-exist", "add-port", "br-ul", "eth0",
		"--", "--may-exist", "add-br", "br0",
		"--", "set", "bridge", "br0", "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13",
		"other_config:hwaddr=" + mac(macBr0, n.Index),
		"--", "--may-exist", "add-port", "br0", "vxlan0",
		"--", "set", "interface", "vxlan0", "type=vxlan", "options:remote_ip=flow", "options:key=flow",
		"options:dst_port=" + strconv.Itoa(port), "ofport_request=1",
		// Pinned as OpenShift SDN pins tun0's: without mtu_request OVS
		// recomputes an internal port's MTU whenever a port is added to
		// or removed from its bridge (measured: 1450 -> 1500 when the
		// staged strategy adds its receive port).
		"--", "set", "interface", "br0", "mtu_request=" + strconv.Itoa(overlayMTU),
	}
}

// ovsNodeLines configures the tap devices OVS created for the bridges'
// LOCAL ports: the underlay address on br-ul, the overlay address on br0.
func ovsNodeLines(n Node) []string {
	return []string{
		"addr add " + pfx(n.UnderlayIP, UnderlayNet) + " dev br-ul",
		"link set br-ul up",
		"link set br0 mtu " + strconv.Itoa(overlayMTU),
		"addr add " + pfx(n.OverlayIP, OverlayNet) + " dev br0",
		"link set br0 up",
	}
}

// Br0Flows is the OpenFlow table of node self's br0 (ovs-ofctl syntax), the
// shape of OpenShift SDN's: what comes out of the tunnel goes to the node,
// what is for a peer's subnet (IP and ARP) goes into the tunnel towards that
// peer's underlay address, anything else is dropped.
func Br0Flows(self Node, nodes []Node) []string {
	flows := []string{"table=0,priority=100,in_port=1,actions=LOCAL"}
	for _, p := range nodes {
		if p.Index == self.Index {
			continue
		}
		for _, m := range []string{"ip,nw_dst=", "arp,arp_tpa="} {
			flows = append(flows, fmt.Sprintf("table=0,priority=100,%s%s,actions=set_field:%s->tun_dst,output:1", m, p.Subnet, p.UnderlayIP))
		}
	}
	return append(flows, "table=0,priority=0,actions=drop")
}

// setupOVSNode starts node n's Open vSwitch and builds its bridges, addresses,
// route and flows. rec is called with each daemon as soon as it runs.
func setupOVSNode(ctx context.Context, n Node, nodes []Node, port int, rec func(Proc) error) (*ovsproc.Instance, error) {
	// eth0 is an OVS port, but the userspace datapath reads it through
	// AF_PACKET, so the node's kernel still sees its frames and, with the
	// default arp_ignore=0, answers ARP for br-ul's address with eth0's
	// own MAC. Peers whose tunnel neighbor cache learns that MAC send
	// VXLAN to eth0, where OVS does not terminate it: pairs stay broken
	// until the entry ages out (minutes). Only br-ul may answer.
	if err := sysctl(n.Netns, "net/ipv4/conf/eth0/arp_ignore", "1"); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: n.OVSDir, Netns: n.Netns})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	for role, pid := range map[string]int{"ovsdb-server": inst.DBServerPID(), "ovs-vswitchd": inst.VswitchdPID()} {
		p, err := newProc(role, n.Name, pid)
		if err == nil {
			err = rec(p)
		}
		if err != nil {
			_ = inst.Stop()
			return nil, err
		}
	}
	if _, err := inst.Vsctl(ctx, ovsBridgeArgs(n, port)...); err != nil {
		return inst, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := ipBatch(ctx, n.Netns, ovsNodeLines(n)); err != nil {
		return inst, fmt.Errorf("node %s: %w", n.Name, err)
	}
	// Userspace tunnels look up the underlay route in OVS's own table; the
	// kernel route of br-ul's address usually lands there too, but add it
	// explicitly as the userspace-tunneling doc does.
	if err := addTunnelRoute(ctx, inst); err != nil {
		return inst, fmt.Errorf("node %s: %w", n.Name, err)
	}
	flows := filepath.Join(n.Dir, "br0.flows")
	if err := os.WriteFile(flows, []byte(strings.Join(Br0Flows(n, nodes), "\n")+"\n"), 0o644); err != nil {
		return inst, err
	}
	if _, err := inst.Ofctl(ctx, "-O", "OpenFlow13", "replace-flows", "br0", flows); err != nil {
		return inst, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return inst, nil
}

// addTunnelRoute adds the underlay route to OVS's userspace tunnel table.
// The add fails ("Error while inserting route") until ovs-vswitchd has seen
// br-ul's new address through netlink, a few ms later: it retries for 5 s.
func addTunnelRoute(ctx context.Context, inst *ovsproc.Instance) error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, err := inst.Appctl(ctx, "ovs/route/add", UnderlayNet.String(), "br-ul")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendGARP sends node n's gratuitous ARP (garp) out of its br-ul.
func sendGARP(ctx context.Context, inst *ovsproc.Instance, n Node) error {
	_, err := inst.Ofctl(ctx, "packet-out", "br-ul", "in_port=LOCAL,packet="+garp(n)+",actions=NORMAL")
	return err
}

// kernelVXLANLines builds node n's flannel-style overlay on VXLAN port
// port: flannel.1 on the underlay, a permanent neighbor entry and an onlink
// route per peer (the FDB half is in kernelFDBLines). It starts by deleting
// flannel.1 if present, which is also how a port change is done by hand: a
// kernel VXLAN device's port cannot be changed in place.
func kernelVXLANLines(n Node, nodes []Node, port int, first bool) []string {
	var l []string
	if first {
		l = append(l,
			"addr add "+pfx(n.UnderlayIP, UnderlayNet)+" dev eth0",
			"link add cni0 type bridge",
			"addr add "+n.OverlayIP.String()+"/24 dev cni0",
			"link set cni0 up",
		)
	} else {
		l = append(l, "link del flannel.1")
	}
	l = append(l,
		fmt.Sprintf("link add flannel.1 address %s type vxlan id 1 local %s dev eth0 dstport %d nolearning",
			mac(macFlannel, n.Index), n.UnderlayIP, port),
		"link set flannel.1 mtu "+strconv.Itoa(overlayMTU),
		"addr add "+flannelIP(n.Index).String()+"/32 dev flannel.1",
		"link set flannel.1 up",
	)
	for _, p := range nodes {
		if p.Index == n.Index {
			continue
		}
		l = append(l,
			fmt.Sprintf("neigh replace %s lladdr %s dev flannel.1 nud permanent", flannelIP(p.Index), mac(macFlannel, p.Index)),
			fmt.Sprintf("route replace %s via %s dev flannel.1 onlink", p.Subnet, flannelIP(p.Index)),
		)
	}
	return l
}

func kernelFDBLines(n Node, nodes []Node) []string {
	var l []string
	for _, p := range nodes {
		if p.Index != n.Index {
			l = append(l, fmt.Sprintf("fdb replace %s dev flannel.1 dst %s self permanent", mac(macFlannel, p.Index), p.UnderlayIP))
		}
	}
	return l
}

func setupKernelNode(ctx context.Context, n Node, nodes []Node, port int, first bool) error {
	if err := ipBatch(ctx, n.Netns, kernelVXLANLines(n, nodes, port, first)); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := bridgeBatch(ctx, n.Netns, kernelFDBLines(n, nodes)); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// sysctl writes a /proc/sys value inside namespace ns: net sysctls resolve
// against the writing thread's namespace.
func sysctl(ns, key, value string) error {
	return netns.Do(ns, func() error {
		if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, ns, err)
		}
		return nil
	})
}

// quietIPv6 turns IPv6 off in a node namespace before its links exist. The
// lab is IPv4 only, and on the OVS backend every router solicitation, MLD
// report and DAD probe of every tap and veth is a broadcast that each
// node's userspace datapath must take from its AF_PACKET socket on eth0.
func quietIPv6(ns string) error {
	for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
		if err := sysctl(ns, k, "1"); err != nil {
			return err
		}
	}
	return nil
}

// garp is a gratuitous ARP request from node n's br-ul (sender and target
// address both n's underlay address), hex-encoded for ovs-ofctl packet-out.
func garp(n Node) string {
	m := strings.ReplaceAll(mac(macBrUL, n.Index), ":", "")
	ip := fmt.Sprintf("%x", n.UnderlayIP.AsSlice())
	return "ffffffffffff" + m + "0806" + // Ethernet
		"0001" + "0800" + "06" + "04" + "0001" + // ARP request, IPv4 over Ethernet
		m + ip + "000000000000" + ip
}
