// Package ifaddr reads the IP addresses configured on a named network
// interface, through netlink, for the agent to find its overlay address
// (openshift-sdn's tun0, flannel.1, vxlan.calico).
//
// It owns only reading: it must not add, remove or change anything. Dumps go
// through pkg/netlinksafe, so an interrupted one is retried, never used half.
package ifaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cutover-dev/cutover/pkg/netlinksafe"
)

// Addr is one address on an interface.
type Addr struct {
	Prefix netip.Prefix
	// Secondary is the kernel's IFA_F_SECONDARY: another address of the
	// same subnet was there first.
	Secondary bool
}

// Reader is what the agent needs: the IPv4 addresses of a named interface,
// in the kernel's order (primary addresses first).
type Reader interface {
	IPv4(name string) ([]Addr, error)
}

// ErrNotFound says the named interface does not exist.
var ErrNotFound = errors.New("no such interface")

// Error is a failed read of one interface's addresses.
type Error struct {
	Interface string
	Err       error
}

func (e *Error) Error() string { return fmt.Sprintf("addresses of %s: %v", e.Interface, e.Err) }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// IsNotFound reports whether err says the interface does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// Kernel reads addresses through a netlink socket of one namespace.
type Kernel struct {
	h *netlink.Handle
}

var _ Reader = (*Kernel)(nil)

// Open returns a Kernel for the named namespace; "" means the caller's own
// (the host's, for the agent).
func Open(nsName string) (*Kernel, error) {
	var h *netlink.Handle
	var err error
	if nsName == "" {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		var ns netns.NsHandle
		if ns, err = netns.GetFromName(nsName); err != nil {
			return nil, fmt.Errorf("ifaddr: netns %q: %w", nsName, err)
		}
		defer func() { _ = ns.Close() }()
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("ifaddr: netlink handle: %w", err)
	}
	return &Kernel{h: h}, nil
}

// Close releases the netlink socket.
func (k *Kernel) Close() { k.h.Close() }

// IPv4 implements Reader.
func (k *Kernel) IPv4(name string) ([]Addr, error) {
	l, err := netlinksafe.LinkByName(k.h, name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, &Error{Interface: name, Err: fmt.Errorf("%w (%w)", ErrNotFound, err)}
		}
		return nil, &Error{Interface: name, Err: err}
	}
	list, err := netlinksafe.AddrList(k.h, l, unix.AF_INET)
	if err != nil {
		return nil, &Error{Interface: name, Err: err}
	}
	out := make([]Addr, 0, len(list))
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IPNet == nil {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, Addr{Prefix: netip.PrefixFrom(ip.Unmap(), ones), Secondary: a.Flags&unix.IFA_F_SECONDARY != 0})
	}
	// Primaries first, keeping the kernel's order within each kind.
	sort.SliceStable(out, func(i, j int) bool { return !out[i].Secondary && out[j].Secondary })
	return out, nil
}

// Fake is an in-memory Reader: interface name to addresses. A name not in
// the map does not exist.
type Fake map[string][]Addr

var _ Reader = Fake(nil)

// IPv4 implements Reader.
func (f Fake) IPv4(name string) ([]Addr, error) {
	addrs, ok := f[name]
	if !ok {
		return nil, &Error{Interface: name, Err: ErrNotFound}
	}
	var out []Addr
	for _, a := range addrs {
		if a.Prefix.Addr().Is4() {
			out = append(out, a)
		}
	}
	return out, nil
}

// Dump returns the fake's state as sorted `ip -4 addr`-style lines.
func (f Fake) Dump() string {
	var lines []string
	for name, addrs := range f {
		if len(addrs) == 0 {
			lines = append(lines, "link "+name)
		}
		for _, a := range addrs {
			l := "addr " + name + " " + a.Prefix.String()
			if a.Secondary {
				l += " secondary"
			}
			lines = append(lines, l)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
