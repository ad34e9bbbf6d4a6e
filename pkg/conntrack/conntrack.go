// Package conntrack deletes conntrack entries narrowly.
//
// After the overlay port moves, UDP flows towards the old port that the
// kernel still tracks (say an UNREPLIED entry a firewall rule made, or a NAT
// binding) can keep steering packets the old way; the agent removes exactly
// those. The package owns that one deletion: entries whose original-direction
// protocol is UDP and whose original-direction destination port is the given
// port, in both the IPv4 and the IPv6 table.
//
// It must never flush a table or touch any other entry: conntrack holds every
// connection of the node, and a flush would cut the node's own control traffic
// (R6, docs/design.md).
package conntrack

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Interface is what the agent needs from conntrack.
type Interface interface {
	// DeleteUDPDstPort deletes the UDP entries whose original destination
	// port is port, in both families, and says how many went.
	DeleteUDPDstPort(port uint16) (int, error)
}

// attempts bounds the re-runs of a deletion whose table dump was interrupted
// (the table changed while it was read). Each run deletes what it saw, so a
// re-run only has to catch what the interrupted dump missed.
const attempts = 5

// Kernel is the real conntrack table of one network namespace, reached through
// a netlink handle (netlink.NewHandleAt for another namespace, netlink.NewHandle
// for the caller's own).
type Kernel struct {
	H *netlink.Handle
}

var _ Interface = Kernel{}

// DeleteUDPDstPort implements Interface.
func (k Kernel) DeleteUDPDstPort(port uint16) (int, error) {
	return DeleteUDPDstPort(k.H, port)
}

// DeleteUDPDstPort deletes from h's namespace the conntrack entries whose
// original-direction protocol is UDP and destination port is port, IPv4 and
// IPv6. It returns how many entries were deleted.
func DeleteUDPDstPort(h *netlink.Handle, port uint16) (int, error) {
	if h == nil {
		return 0, errors.New("conntrack: handle: is nil; pass netlink.NewHandle() or netlink.NewHandleAt(ns)")
	}
	if port == 0 {
		return 0, errors.New("conntrack: port 0: is not a valid destination port (would match nothing meaningful)")
	}
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddProtocol(unix.IPPROTO_UDP); err != nil {
		return 0, fmt.Errorf("conntrack: filter proto udp: %w", err)
	}
	if err := filter.AddPort(netlink.ConntrackOrigDstPort, port); err != nil {
		return 0, fmt.Errorf("conntrack: filter dport %d: %w", port, err)
	}
	total := 0
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := deleteFamily(h, fam, filter)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: delete udp dport %d (family %s): %w", port, familyName(fam), err))
		}
	}
	return total, errors.Join(errs...)
}

func deleteFamily(h *netlink.Handle, fam netlink.InetFamily, filter netlink.CustomConntrackFilter) (int, error) {
	total := 0
	var err error
	for i := 0; i < attempts; i++ {
		var n uint
		n, err = h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filter)
		total += int(n)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return total, err
		}
	}
	return total, fmt.Errorf("dump still interrupted after %d attempts: %w", attempts, err)
}

func familyName(f netlink.InetFamily) string {
	if f == unix.AF_INET6 {
		return "ipv6"
	}
	return "ipv4"
}

// Flow is one entry of the fake table, in original direction.
type Flow struct {
	Proto   string // "udp", "tcp"
	Src     string // address
	Dst     string
	SrcPort uint16
	DstPort uint16
}

func (f Flow) String() string {
	return fmt.Sprintf("%s src=%s dst=%s sport=%d dport=%d", f.Proto, f.Src, f.Dst, f.SrcPort, f.DstPort)
}

// Fake is an in-memory conntrack table for unit tests of the agent's logic.
type Fake struct {
	mu    sync.Mutex
	Flows []Flow
	// Err, when set, is returned by the next DeleteUDPDstPort instead of deleting.
	Err error
}

var _ Interface = (*Fake)(nil)

// DeleteUDPDstPort implements Interface.
func (f *Fake) DeleteUDPDstPort(port uint16) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if port == 0 {
		return 0, errors.New("conntrack: port 0: is not a valid destination port (would match nothing meaningful)")
	}
	if f.Err != nil {
		err := f.Err
		f.Err = nil
		return 0, err
	}
	kept := f.Flows[:0]
	n := 0
	for _, fl := range f.Flows {
		if fl.Proto == "udp" && fl.DstPort == port {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.Flows = kept
	return n, nil
}

// Dump returns the table as sorted lines in the style of `conntrack -L`
// (original direction only).
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	lines := make([]string, 0, len(f.Flows))
	for _, fl := range f.Flows {
		lines = append(lines, fl.String())
	}
	sort.Strings(lines)
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}
