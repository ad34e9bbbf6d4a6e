package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
)

// Fixed lab address plan (all within 198.18.0.0/15).
var (
	UnderlayNet = netip.MustParsePrefix("198.18.0.0/17")
	MgmtNet     = netip.MustParsePrefix("198.18.128.0/17")
	OverlayNet  = netip.MustParsePrefix("198.19.0.0/16")
	HubUnderlay = netip.MustParseAddr("198.18.0.1")
	HubMgmt     = netip.MustParseAddr("198.18.128.1")
)

// Ports the agents listen on, on their management address.
const (
	AgentPort   = 9443
	MetricsPort = 9444
)

// MTU of the overlay interfaces: the underlay's 1500 minus VXLAN's 50, as
// both OpenShift SDN (tun0) and flannel (flannel.1) configure it.
const overlayMTU = 1450

// Node is one lab node and where to find its parts.
type Node struct {
	Index      int          `json:"index"`
	Name       string       `json:"name"`  // n<i>
	Netns      string       `json:"netns"` // cot-lab-<lab>-n<i>
	UnderlayIP netip.Addr   `json:"underlay_ip"`
	MgmtIP     netip.Addr   `json:"mgmt_ip"`
	OverlayIP  netip.Addr   `json:"overlay_ip"`     // 198.19.i.1: answers pings and probes on both backends
	Subnet     netip.Prefix `json:"overlay_subnet"` // 198.19.i.0/24, the node's pod subnet
	AgentAddr  string       `json:"agent_addr"`     // mgmt:9443
	Metrics    string       `json:"metrics_addr"`   // mgmt:9444
	Dir        string       `json:"dir"`            // <lab>/n<i>
	StateDir   string       `json:"state_dir"`      // <lab>/n<i>/state, the agent's
	OVSDir     string       `json:"ovs_dir,omitempty"`
	OVSDBSock  string       `json:"ovsdb_sock,omitempty"` // unix socket of the node's ovsdb-server
}

func nodeName(i int) string { return "n" + strconv.Itoa(i) }

func nsPrefix(lab string) string { return "cot-lab-" + lab + "-" }

// HubNetns is the hub namespace of lab name.
func HubNetns(lab string) string { return nsPrefix(lab) + "hub" }

// NodeNetns is node i's namespace in lab name.
func NodeNetns(lab string, i int) string { return nsPrefix(lab) + nodeName(i) }

// ownNSRE matches exactly the suffixes this package gives namespaces.
var ownNSRE = regexp.MustCompile(`^(hub|n[0-9]{1,3})$`)

func isLabNetns(lab, ns string) bool {
	p := nsPrefix(lab)
	return len(ns) > len(p) && ns[:len(p)] == p && ownNSRE.MatchString(ns[len(p):])
}

func newNode(lab, dir string, i int, backend string) Node {
	n := Node{
		Index:      i,
		Name:       nodeName(i),
		Netns:      NodeNetns(lab, i),
		UnderlayIP: netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}),
		MgmtIP:     netip.AddrFrom4([4]byte{198, 18, 128, byte(10 + i)}),
		OverlayIP:  netip.AddrFrom4([4]byte{198, 19, byte(i), 1}),
		Subnet:     netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(i), 0}), 24),
		Dir:        filepath.Join(dir, nodeName(i)),
	}
	n.AgentAddr = netip.AddrPortFrom(n.MgmtIP, AgentPort).String()
	n.Metrics = netip.AddrPortFrom(n.MgmtIP, MetricsPort).String()
	n.StateDir = filepath.Join(n.Dir, "state")
	if backend == BackendOVS {
		n.OVSDir = filepath.Join(n.Dir, "ovs")
		n.OVSDBSock = filepath.Join(n.OVSDir, "db.sock")
	}
	return n
}

// flannelIP is node i's address on flannel.1: the .0 of its subnet, as
// flannel assigns it and as peers' neighbor entries and routes name it.
func flannelIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, byte(i), 0}) }

// MAC kinds: deterministic, locally administered addresses so that peers'
// FDB and neighbor entries can be computed without reading anything back.
const (
	macBr0     = 1
	macBrUL    = 2
	macFlannel = 3
)

func mac(kind, i int) string { return fmt.Sprintf("02:c0:de:%02x:00:%02x", kind, i) }
