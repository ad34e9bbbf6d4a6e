package vxlan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"
)

// Interface is what the agent needs from the kernel VXLAN device of a node.
type Interface interface {
	// Snapshot reads the named device and everything bound to it.
	Snapshot(name string) (Snapshot, error)
	// Recreate replaces the device described by snap with one on newPort,
	// keeping everything else, and reports the window. It also completes a
	// recreation that stopped half way (old device gone, or a leftover
	// temporary device), so it is safe to replay.
	Recreate(snap Snapshot, newPort int) (Window, error)
	// Prebuild builds, ahead of Recreate, the device Recreate(snap, newPort)
	// would build first: down, under a temporary name, with snap's FDB and
	// neighbours but no addresses (so it holds no port and attracts no
	// traffic). A later Recreate on newPort adopts it, bringing its FDB and
	// neighbours in line with the snapshot it is given; anything else
	// replaces it. Window.Prepare is the build time.
	Prebuild(snap Snapshot, newPort int) (Window, error)
	// SetFDBPorts rewrites the destination port of every FDB entry of the
	// device described by snap (0 = use the device's port again).
	SetFDBPorts(snap Snapshot, port int) error
	// Listen builds the staged strategy's receiver (staged.go): the
	// device Prebuild would build on port, reverse-path filtering off on
	// it, up. A later Recreate on port adopts it while it receives;
	// Cleanup removes it.
	Listen(snap Snapshot, port int) error
	// ReversePathFilter reads the device's rp_filter and conf.all's.
	ReversePathFilter(name string) (dev, all int, err error)
	// SetReversePathFilter sets the device's rp_filter.
	SetReversePathFilter(name string, value int) error
	// Arm reads the named device for a Recreate onto newPort that runs
	// later (at a commit instant), tops the device Prebuild made up to
	// that read, and watches the device from before the read on (see
	// Armed). ctx bounds the reading. The caller closes the result or
	// passes it to RecreateArmed.
	Arm(ctx context.Context, name string, newPort int) (*Armed, error)
	// RecreateArmed is Recreate(a.Snap, newPort) without reading the
	// device again: it fails with ErrChanged, touching nothing, when the
	// device or anything bound to it may have changed since Arm read it,
	// and the caller then reads afresh. It closes a.
	RecreateArmed(a *Armed) (Window, error)
	// Link reads the named device's configuration only (no addresses,
	// FDB, neighbours or routes): one request.
	Link(name string) (Device, error)
	// Cleanup deletes the old device a Recreate left behind under
	// OldName(name) (see Kernel.KeepOld) and a prebuilt device Recreate did
	// not adopt; nothing left is not an error.
	Cleanup(name string) error
}

// Device is the configuration of a kernel VXLAN link, as `ip -d link` shows it.
type Device struct {
	Name  string `json:"name"`
	Index int    `json:"index,omitempty"` // informational; a recreated device gets a new one
	MTU   int    `json:"mtu"`
	MAC   string `json:"mac"`
	// TxQLen is the transmit queue length; -1 when unknown.
	TxQLen int  `json:"txqlen"`
	Up     bool `json:"up"`

	VNI         int    `json:"vni"`
	Port        int    `json:"port"` // the UDP destination port, also the one the device listens on
	Local       net.IP `json:"local,omitempty"`
	Group       net.IP `json:"group,omitempty"`   // multicast group or unicast remote
	VtepDev     string `json:"vtepDev,omitempty"` // underlay device the tunnel is pinned to (ip link ... dev X)
	TTL         int    `json:"ttl,omitempty"`
	TOS         int    `json:"tos,omitempty"`
	Learning    bool   `json:"learning"`
	Proxy       bool   `json:"proxy,omitempty"`
	RSC         bool   `json:"rsc,omitempty"`
	L2Miss      bool   `json:"l2miss,omitempty"`
	L3Miss      bool   `json:"l3miss,omitempty"`
	UDPCsum     bool   `json:"udpCsum,omitempty"`
	UDP6ZeroTx  bool   `json:"udp6ZeroCsumTx,omitempty"`
	UDP6ZeroRx  bool   `json:"udp6ZeroCsumRx,omitempty"`
	NoAge       bool   `json:"noAge,omitempty"`
	GBP         bool   `json:"gbp,omitempty"`
	FlowBased   bool   `json:"external,omitempty"`
	Age         int    `json:"ageing,omitempty"`
	Limit       int    `json:"maxaddress,omitempty"`
	SrcPortLow  int    `json:"srcPortLow,omitempty"`
	SrcPortHigh int    `json:"srcPortHigh,omitempty"`
}

// Addr is an address on the device. Kernel-generated IPv6 link-local
// addresses are not recorded: the recreated device (same MAC) generates
// the same one.
type Addr struct {
	CIDR  string `json:"cidr"`
	Peer  string `json:"peer,omitempty"`
	Scope int    `json:"scope,omitempty"`
	Flags int    `json:"flags,omitempty"`
}

// FDBEntry is one remote of one MAC in the device's forwarding database
// (`bridge fdb show dev X`). A MAC with several remotes (the all-zero flood
// entry) has one FDBEntry per remote.
type FDBEntry struct {
	MAC     string `json:"mac"`
	Dst     net.IP `json:"dst"`
	Port    int    `json:"port,omitempty"`    // 0: the device's port
	VNI     int    `json:"vni,omitempty"`     // 0: the device's VNI
	Ifindex int    `json:"ifindex,omitempty"` // underlay device for this remote, 0: routed
	State   int    `json:"state"`             // NUD_* (permanent, reachable, ...)
	Flags   int    `json:"flags"`             // NTF_*
}

// Neighbor is an ARP/NDP entry on the device.
type Neighbor struct {
	IP    net.IP `json:"ip"`
	MAC   string `json:"mac"`
	State int    `json:"state"`
	Flags int    `json:"flags,omitempty"`
}

// Route is a route whose output device is the VXLAN device. Routes the kernel
// derives from addresses (proto kernel, and the local table) are not
// recorded: they come back with the addresses.
type Route struct {
	Dst      string `json:"dst"` // CIDR; "default" for the default route
	Gw       net.IP `json:"gw,omitempty"`
	Src      net.IP `json:"src,omitempty"`
	Family   int    `json:"family"`
	Table    int    `json:"table"`
	Protocol int    `json:"protocol"`
	Scope    int    `json:"scope"`
	Type     int    `json:"type"`
	Priority int    `json:"metric,omitempty"`
	Flags    int    `json:"flags,omitempty"` // RTNH_F_ONLINK and friends
	MTU      int    `json:"mtu,omitempty"`
}

// Snapshot is a VXLAN device and everything bound to its ifindex. The agent
// persists it as the prior state, so it is plain JSON.
type Snapshot struct {
	Device    Device     `json:"device"`
	Addrs     []Addr     `json:"addrs"`
	FDB       []FDBEntry `json:"fdb"`
	Neighbors []Neighbor `json:"neighbors"`
	Routes    []Route    `json:"routes"`
}

// Window is what one Recreate measured.
type Window struct {
	Strategy string `json:"strategy"`
	// Prepare is the time spent before the old device was touched
	// (building the new device under a temporary name, or, when Adopted,
	// topping up the prebuilt one and giving it its addresses).
	Prepare time.Duration `json:"prepareNs"`
	// Adopted says Recreate used the device Prebuild made.
	Adopted bool `json:"adopted,omitempty"`
	// Absent runs from the start of the old device's deletion until the new
	// device is up under the old name.
	Absent time.Duration `json:"absentNs"`
	// Total runs from the start of the deletion until the last entry is
	// restored: the time the node's overlay is not fully working.
	Total time.Duration `json:"totalNs"`
	// Calls is how many netlink requests ran inside Total.
	Calls int `json:"calls"`
	// Cleanup is the deletion of the old device after the window.
	Cleanup time.Duration `json:"cleanupNs,omitempty"`
	// Start and End are the window's instants (Total apart); zero when
	// nothing was recreated.
	Start time.Time `json:"-"`
	End   time.Time `json:"-"`
}

const (
	// StrategyPrebuilt builds the new device under a temporary name with its
	// addresses, FDB and neighbours while the old one still works, then
	// takes the old device down and renames it away, renames and raises the
	// new one in one request, adds the routes, and only then deletes the old
	// device. The default.
	StrategyPrebuilt = "prebuilt"
	// StrategyDeleteFirst deletes the old device and builds the new one from
	// scratch. Kept to measure against.
	StrategyDeleteFirst = "delete-first"
)

// Text returns the snapshot as canonical, sorted lines in the style of
// `ip -d link`, `ip addr`, `bridge fdb`, `ip neigh` and `ip route`, for
// tests to compare and humans to read. Interface indexes are left out so a
// recreated device compares equal.
func (s Snapshot) Text() string {
	d := s.Device
	var b strings.Builder
	state := "down"
	if d.Up {
		state = "up"
	}
	fmt.Fprintf(&b, "link %s %s mtu %d address %s txqlen %d vxlan id %d dstport %d", d.Name, state, d.MTU, d.MAC, d.TxQLen, d.VNI, d.Port)
	if d.Local != nil {
		fmt.Fprintf(&b, " local %s", d.Local)
	}
	if d.Group != nil {
		fmt.Fprintf(&b, " group %s", d.Group)
	}
	if d.VtepDev != "" {
		fmt.Fprintf(&b, " dev %s", d.VtepDev)
	}
	fmt.Fprintf(&b, " srcport %d %d ttl %d tos %d ageing %d maxaddress %d", d.SrcPortLow, d.SrcPortHigh, d.TTL, d.TOS, d.Age, d.Limit)
	for _, f := range []struct {
		on   bool
		name string
	}{
		{!d.Learning, "nolearning"}, {d.Proxy, "proxy"}, {d.RSC, "rsc"}, {d.L2Miss, "l2miss"}, {d.L3Miss, "l3miss"},
		{d.UDPCsum, "udpcsum"}, {d.UDP6ZeroTx, "udp6zerocsumtx"}, {d.UDP6ZeroRx, "udp6zerocsumrx"},
		{d.NoAge, "noage"}, {d.GBP, "gbp"}, {d.FlowBased, "external"},
	} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	b.WriteString("\n")
	var lines []string
	for _, a := range s.Addrs {
		l := fmt.Sprintf("addr %s %s scope %d flags %#x", d.Name, a.CIDR, a.Scope, a.Flags)
		if a.Peer != "" {
			l += " peer " + a.Peer
		}
		lines = append(lines, l)
	}
	for _, f := range s.FDB {
		l := fmt.Sprintf("fdb %s %s dst %s", d.Name, f.MAC, f.Dst)
		if f.Port != 0 {
			l += fmt.Sprintf(" port %d", f.Port)
		}
		if f.VNI != 0 {
			l += fmt.Sprintf(" vni %d", f.VNI)
		}
		if f.Ifindex != 0 {
			l += fmt.Sprintf(" via-ifindex %d", f.Ifindex)
		}
		lines = append(lines, l+fmt.Sprintf(" state %s flags %#x", nudName(f.State), f.Flags))
	}
	for _, n := range s.Neighbors {
		lines = append(lines, fmt.Sprintf("neigh %s %s lladdr %s %s flags %#x", d.Name, n.IP, n.MAC, nudName(n.State), n.Flags))
	}
	for _, r := range s.Routes {
		l := fmt.Sprintf("route %s", r.Dst)
		if r.Gw != nil {
			l += fmt.Sprintf(" via %s", r.Gw)
		}
		l += fmt.Sprintf(" dev %s table %d proto %d scope %d type %d", d.Name, r.Table, r.Protocol, r.Scope, r.Type)
		if r.Src != nil {
			l += fmt.Sprintf(" src %s", r.Src)
		}
		if r.Priority != 0 {
			l += fmt.Sprintf(" metric %d", r.Priority)
		}
		if r.MTU != 0 {
			l += fmt.Sprintf(" mtu %d", r.MTU)
		}
		if r.Flags != 0 {
			l += fmt.Sprintf(" flags %#x", r.Flags)
		}
		lines = append(lines, l)
	}
	sort.Strings(lines)
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}

func nudName(s int) string {
	names := []struct {
		bit  int
		name string
	}{
		{0x01, "INCOMPLETE"}, {0x02, "REACHABLE"}, {0x04, "STALE"}, {0x08, "DELAY"},
		{0x10, "PROBE"}, {0x20, "FAILED"}, {0x40, "NOARP"}, {0x80, "PERMANENT"},
	}
	var out []string
	for _, n := range names {
		if s&n.bit != 0 {
			out = append(out, n.name)
		}
	}
	if len(out) == 0 {
		return "NONE"
	}
	return strings.Join(out, ",")
}

// Validate checks what Recreate relies on.
func (s Snapshot) Validate() error {
	d := s.Device
	if d.Name == "" || len(d.Name) > 15 {
		return &Error{Op: "validate", Device: d.Name, Err: fmt.Errorf("device.name %q: must be 1-15 characters (a Linux interface name)", d.Name)}
	}
	if d.VNI < 0 || d.VNI > 1<<24-1 {
		return &Error{Op: "validate", Device: d.Name, Err: fmt.Errorf("device.vni %d: must be 0-16777215", d.VNI)}
	}
	if err := validPort("device.port", d.Port); err != nil {
		return &Error{Op: "validate", Device: d.Name, Err: err}
	}
	if _, err := net.ParseMAC(d.MAC); err != nil {
		return &Error{Op: "validate", Device: d.Name, Err: fmt.Errorf("device.mac %q: %w", d.MAC, err)}
	}
	return nil
}

func validPort(field string, p int) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("%s %d: must be a UDP port 1-65535", field, p)
	}
	return nil
}

// Error is a failed operation on a device.
type Error struct {
	Op     string // "snapshot", "recreate", "set-fdb-ports", "validate"
	Device string
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("vxlan %s %s: %v", e.Op, e.Device, e.Err) }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrNotFound: the named device does not exist.
var ErrNotFound = errors.New("no such device")

// ErrNotVXLAN: the named device exists but is not a VXLAN link.
var ErrNotVXLAN = errors.New("not a vxlan device")

// IsNotFound reports whether err says the device does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsNotVXLAN reports whether err says the device is of another link type.
func IsNotVXLAN(err error) bool { return errors.Is(err, ErrNotVXLAN) }
