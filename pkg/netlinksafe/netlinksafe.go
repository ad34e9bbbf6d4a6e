// Package netlinksafe retries interrupted netlink dumps in one place.
//
// Since vishvananda/netlink v1.3, a dump that the kernel marks as interrupted
// (NLM_F_DUMP_INTR: the table changed while it was being read) returns the
// partial result together with netlink.ErrDumpInterrupted. Using such a
// partial list as if it were complete is how a reconciler deletes a route that
// exists or misses a link it should have seen, so every dump in this project
// goes through these wrappers: they retry a bounded number of times and either
// return a consistent result or an error that still satisfies
// errors.Is(err, netlink.ErrDumpInterrupted). The idea is the one of
// containernetworking/plugins pkg/netlinksafe.
//
// The package owns only the retry policy. It must not change anything in the
// kernel and must not hide other errors: those are returned on the first try.
package netlinksafe

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Attempts is how many times a dump is tried before giving up. Interrupted
// dumps are rare and clear up at once on a quiet table; a table that changes
// on every one of five reads is busy enough that the caller should hear of it.
const Attempts = 5

// Retry calls dump until it returns something other than
// netlink.ErrDumpInterrupted, at most attempts times (at least once). A partial
// result is never returned: on exhaustion the result is the zero value and the
// error wraps netlink.ErrDumpInterrupted.
func Retry[T any](attempts int, what string, dump func() (T, error)) (T, error) {
	if attempts < 1 {
		attempts = 1
	}
	var zero T
	for i := 0; i < attempts; i++ {
		v, err := dump()
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return zero, err
		}
	}
	return zero, fmt.Errorf("%s: dump still interrupted after %d attempts: %w", what, attempts, netlink.ErrDumpInterrupted)
}

// LinkList is netlink.Handle.LinkList with retries.
func LinkList(h *netlink.Handle) ([]netlink.Link, error) {
	return Retry(Attempts, "link list", h.LinkList)
}

// LinkByName is netlink.Handle.LinkByName with retries (it falls back to a
// dump on kernels without name lookup).
func LinkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	return Retry(Attempts, "link "+name, func() (netlink.Link, error) { return h.LinkByName(name) })
}

// LinkByIndex is netlink.Handle.LinkByIndex with retries.
func LinkByIndex(h *netlink.Handle, index int) (netlink.Link, error) {
	return Retry(Attempts, fmt.Sprintf("link index %d", index), func() (netlink.Link, error) { return h.LinkByIndex(index) })
}

// AddrList is netlink.Handle.AddrList with retries.
func AddrList(h *netlink.Handle, link netlink.Link, family int) ([]netlink.Addr, error) {
	return Retry(Attempts, "address list", func() ([]netlink.Addr, error) { return h.AddrList(link, family) })
}

// RouteListFiltered is netlink.Handle.RouteListFiltered with retries.
func RouteListFiltered(h *netlink.Handle, family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return Retry(Attempts, "route list", func() ([]netlink.Route, error) { return h.RouteListFiltered(family, filter, mask) })
}

// NeighList is netlink.Handle.NeighList with retries.
func NeighList(h *netlink.Handle, linkIndex, family int) ([]netlink.Neigh, error) {
	return Retry(Attempts, "neighbour list", func() ([]netlink.Neigh, error) { return h.NeighList(linkIndex, family) })
}

// NeighListExecute is netlink.Handle.NeighListExecute with retries.
func NeighListExecute(h *netlink.Handle, msg netlink.Ndmsg) ([]netlink.Neigh, error) {
	return Retry(Attempts, "neighbour list", func() ([]netlink.Neigh, error) { return h.NeighListExecute(msg) })
}

// ConntrackTableList is netlink.Handle.ConntrackTableList with retries.
func ConntrackTableList(h *netlink.Handle, table netlink.ConntrackTableType, family netlink.InetFamily) ([]*netlink.ConntrackFlow, error) {
	return Retry(Attempts, "conntrack list", func() ([]*netlink.ConntrackFlow, error) { return h.ConntrackTableList(table, family) })
}

// SocketDiagUDP is netlink.Handle.SocketDiagUDP with retries.
func SocketDiagUDP(h *netlink.Handle, family uint8) ([]*netlink.Socket, error) {
	return Retry(Attempts, "udp socket list", func() ([]*netlink.Socket, error) { return h.SocketDiagUDP(family) })
}
