// Package udpport answers one question for preflight: is a UDP port free on
// this node (in one network namespace)?
//
// A port is held when a UDP socket (IPv4 or IPv6, bound or connected) has it
// as its local port, or when a kernel tunnel device (vxlan, geneve) is
// configured with it as its destination port. The second check matters
// because the kernel opens a tunnel device's socket only while the device is
// up: a vxlan device that is down has no socket at all (neither sock_diag nor
// /proc/net/udp shows it) yet takes the port the moment it comes up. While it
// is up, its socket does show up in sock_diag and /proc/net/udp, with an inode
// but without an owning process; we name the device rather than the inode.
// OVS userspace vxlan ports (datapath_type=netdev) bind an ordinary socket in
// ovs-vswitchd's namespace and are found as sockets.
//
// Namespaces: sockets are listed with NETLINK_SOCK_DIAG over the caller's
// handle, whose netlink socket lives in the target namespace, so no /proc
// file and no thread switch is involved (/proc/self/net would follow the
// thread's namespace only through /proc/thread-self/net, an easy trap). The
// handle must have been opened with NETLINK_INET_DIAG: netlink's Handle
// silently falls back to a fresh socket in the calling thread's namespace for
// a protocol it has no socket for, which would answer for the wrong
// namespace. Check refuses such a handle; Open makes a correct one.
//
// The package only reads; it must not bind, close or change anything.
package udpport

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"

	"github.com/cutover-dev/cutover/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Holder says what holds a port.
type Holder struct {
	// Kind is "socket", "vxlan" or "geneve"; empty when the port is free.
	Kind string `json:"kind,omitempty"`
	// Inode of the socket (Kind "socket"); 0 for kernel sockets without a file.
	Inode uint32 `json:"inode,omitempty"`
	// Local is the socket's local address:port (Kind "socket").
	Local string `json:"local,omitempty"`
	// Device is the tunnel device's name (Kind "vxlan", "geneve").
	Device string `json:"device,omitempty"`
}

// String names the holder for humans: "socket inode 1234 (0.0.0.0:4789)",
// "vxlan device flannel.1".
func (h Holder) String() string {
	switch h.Kind {
	case "":
		return "nothing"
	case "socket":
		return fmt.Sprintf("socket inode %d (%s)", h.Inode, h.Local)
	default:
		return fmt.Sprintf("%s device %s", h.Kind, h.Device)
	}
}

// Checker is what preflight needs.
type Checker interface {
	// Free reports whether nothing holds the UDP port, and else what does.
	Free(port uint16) (bool, Holder, error)
}

// Kernel checks the namespace its handle was opened in.
type Kernel struct {
	H *netlink.Handle
}

var _ Checker = Kernel{}

// Open returns a Kernel for the named namespace ("" for the caller's own)
// with a handle that has the route and sock_diag protocols. Close it with
// k.H.Close().
func Open(nsName string) (Kernel, error) {
	fams := []int{unix.NETLINK_ROUTE, unix.NETLINK_INET_DIAG}
	if nsName == "" {
		h, err := netlink.NewHandle(fams...)
		if err != nil {
			return Kernel{}, fmt.Errorf("udpport: netlink handle: %w", err)
		}
		return Kernel{H: h}, nil
	}
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		return Kernel{}, fmt.Errorf("udpport: netns %q: %w", nsName, err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns, fams...)
	if err != nil {
		return Kernel{}, fmt.Errorf("udpport: netlink handle in netns %q: %w", nsName, err)
	}
	return Kernel{H: h}, nil
}

// Free implements Checker.
func (k Kernel) Free(port uint16) (bool, Holder, error) { return Free(k.H, port) }

// Free reports whether UDP port is free in h's namespace. Tunnel devices are
// looked at first because they hold the port even when down and their name is
// what an operator needs.
func Free(h *netlink.Handle, port uint16) (bool, Holder, error) {
	if h == nil {
		return false, Holder{}, errors.New("udpport: handle: is nil; use udpport.Open")
	}
	if port == 0 {
		return false, Holder{}, errors.New("udpport: port 0: is not a port one can check (0 means any port to bind)")
	}
	if !h.SupportsNetlinkFamily(unix.NETLINK_INET_DIAG) {
		return false, Holder{}, errors.New("udpport: handle: has no NETLINK_INET_DIAG socket, so sock_diag would run in the calling thread's namespace; open it with netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_INET_DIAG) or udpport.Open")
	}
	links, err := netlinksafe.LinkList(h)
	if err != nil {
		return false, Holder{}, fmt.Errorf("udpport: list links: %w", err)
	}
	var tunnels []Holder
	for _, l := range links {
		switch v := l.(type) {
		case *netlink.Vxlan:
			if v.Port == int(port) {
				tunnels = append(tunnels, Holder{Kind: "vxlan", Device: v.Name})
			}
		case *netlink.Geneve:
			if v.Dport == port {
				tunnels = append(tunnels, Holder{Kind: "geneve", Device: v.Name})
			}
		}
	}
	if len(tunnels) > 0 {
		// Deterministic: the same node state names the same holder.
		sort.Slice(tunnels, func(i, j int) bool { return tunnels[i].Device < tunnels[j].Device })
		return false, tunnels[0], nil
	}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlinksafe.SocketDiagUDP(h, fam)
		if err != nil {
			return false, Holder{}, fmt.Errorf("udpport: sock_diag udp family %d: %w", fam, err)
		}
		for _, s := range socks {
			if s.ID.SourcePort == port {
				return false, Holder{
					Kind:  "socket",
					Inode: s.INode,
					Local: net.JoinHostPort(s.ID.Source.String(), strconv.Itoa(int(port))),
				}, nil
			}
		}
	}
	return true, Holder{}, nil
}

// Fake is an in-memory Checker: Held maps ports to their holders.
type Fake struct {
	mu   sync.Mutex
	Held map[uint16]Holder
}

var _ Checker = (*Fake)(nil)

// Free implements Checker.
func (f *Fake) Free(port uint16) (bool, Holder, error) {
	if port == 0 {
		return false, Holder{}, errors.New("udpport: port 0: is not a port one can check (0 means any port to bind)")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.Held[port]; ok {
		return false, h, nil
	}
	return true, Holder{}, nil
}

// Hold marks port as held by h.
func (f *Fake) Hold(port uint16, h Holder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Held == nil {
		f.Held = map[uint16]Holder{}
	}
	f.Held[port] = h
}
