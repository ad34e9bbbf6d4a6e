package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The staged strategy's receiver (docs/staged.md). Listen builds, under
// TmpName, the device Prebuild would build — same VNI, MAC, local address
// and options, the FDB and neighbours, no addresses and no routes — on the
// new port, and brings it up: it holds the new port and decapsulates what
// peers send there, while the device itself keeps sending and receiving on
// the old port. Nothing is routed to it (no address, no route), so it never
// sends. A later Recreate on the new port adopts it while it is up: the
// rename that makes it the device happens while it keeps receiving (a
// kernel that refuses renaming a running link gets it taken down first, a
// gap of a few ms).
//
// Reverse-path filtering: packets decapsulated on the receiver come in on a
// device without addresses, so any rp_filter drops them (the kernel's
// fib_validate_source fails a source check on an address-less device; loose
// mode too, measured). Listen turns it off on the receiver; conf.all, which
// overrides any per-device value upwards, must be 0 (ReversePathFilter).

// IPv4 devconf indexes and netconf attributes (linux/ip.h, netconf.h);
// golang.org/x/sys does not name them.
const (
	ipv4DevconfRPFilter = 8 // IPV4_DEVCONF_RP_FILTER
	netconfaIfindex     = 1 // NETCONFA_IFINDEX
	netconfaRPFilter    = 3 // NETCONFA_RP_FILTER
	netconfaIfindexAll  = -1
)

// Listen implements Interface.
func (k *Kernel) Listen(snap Snapshot, port int) error {
	name := snap.Device.Name
	fail := func(err error) error { return &Error{Op: "listen", Device: name, Err: err} }
	if err := snap.Validate(); err != nil {
		return err
	}
	if err := validPort("port", port); err != nil {
		return fail(err)
	}
	tmp := tmpName(name)
	v := k.adoptable(snap, tmp, port)
	if v == nil {
		if err := k.removeLeftovers(oldName(name), tmp); err != nil {
			return fail(err)
		}
		var err error
		if v, err = k.buildTmp(snap, tmp, port, false); err != nil {
			return fail(err)
		}
	}
	rp := 0
	if k.testLooseRPFilter {
		rp = 2
	}
	if err := k.setRPFilter(v.Attrs().Index, rp); err != nil {
		return fail(fmt.Errorf("rp_filter off on %s: %w", tmp, err))
	}
	if v.Attrs().Flags&net.FlagUp == 0 {
		if err := k.H.LinkSetUp(v); err != nil {
			return fail(fmt.Errorf("set %s up: %w", tmp, err))
		}
	}
	return nil
}

// ReversePathFilter implements Interface.
func (k *Kernel) ReversePathFilter(name string) (dev, all int, err error) {
	v, err := k.link("rp-filter", name)
	if err != nil {
		return 0, 0, err
	}
	if dev, err = k.rpFilter(v.Attrs().Index); err != nil {
		return 0, 0, &Error{Op: "rp-filter", Device: name, Err: err}
	}
	if all, err = k.rpFilterAll(); err != nil {
		return 0, 0, &Error{Op: "rp-filter", Device: name, Err: err}
	}
	return dev, all, nil
}

// SetReversePathFilter implements Interface.
func (k *Kernel) SetReversePathFilter(name string, value int) error {
	v, err := k.link("rp-filter", name)
	if err != nil {
		return err
	}
	if err := k.setRPFilter(v.Attrs().Index, value); err != nil {
		return &Error{Op: "rp-filter", Device: name, Err: err}
	}
	return nil
}

// rpFilter reads a device's rp_filter from its IFLA_INET_CONF (a u32 array
// of the IPv4 devconf, index i holding devconf i+1).
func (k *Kernel) rpFilter(ifindex int) (int, error) {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	msgs, err := k.request(unix.RTM_GETLINK, unix.NLM_F_ACK, msg).Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return 0, fmt.Errorf("link index %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_AF_SPEC {
				continue
			}
			fams, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return 0, err
			}
			for _, f := range fams {
				if f.Attr.Type&^unix.NLA_F_NESTED != unix.AF_INET {
					continue
				}
				confs, err := nl.ParseRouteAttr(f.Value)
				if err != nil {
					return 0, err
				}
				for _, c := range confs {
					if c.Attr.Type&^unix.NLA_F_NESTED == unix.IFLA_INET_CONF && len(c.Value) >= 4*ipv4DevconfRPFilter {
						return int(binary.NativeEndian.Uint32(c.Value[4*(ipv4DevconfRPFilter-1):])), nil
					}
				}
			}
		}
	}
	return 0, errors.New("no IPv4 devconf in the link's answer")
}

// setRPFilter sets a device's rp_filter (IFLA_AF_SPEC/AF_INET/
// IFLA_INET_CONF, nested devconf attributes).
func (k *Kernel) setRPFilter(ifindex, value int) error {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req := k.request(unix.RTM_SETLINK, unix.NLM_F_ACK, msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	inet := spec.AddRtAttr(unix.AF_INET, nil)
	conf := inet.AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(ipv4DevconfRPFilter, nl.Uint32Attr(uint32(value)))
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("link index %d: set rp_filter %d: %w", ifindex, value, err)
	}
	return nil
}

// rpFilterAll reads net.ipv4.conf.all.rp_filter of the namespace.
func (k *Kernel) rpFilterAll() (int, error) {
	// struct netconfmsg is one byte of family, padded to 4.
	req := k.request(unix.RTM_GETNETCONF, unix.NLM_F_ACK, rawData{unix.AF_INET, 0, 0, 0})
	idx := make([]byte, 4)
	all := int32(netconfaIfindexAll)
	binary.NativeEndian.PutUint32(idx, uint32(all))
	req.AddData(nl.NewRtAttr(netconfaIfindex, idx))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNETCONF)
	if err != nil {
		return 0, fmt.Errorf("netconf all: %w", err)
	}
	for _, m := range msgs {
		if len(m) < 4 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[4:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type == netconfaRPFilter && len(a.Value) >= 4 {
				return int(binary.NativeEndian.Uint32(a.Value)), nil
			}
		}
	}
	return 0, errors.New("netconf all: no rp_filter in the answer")
}

// rawData is a netlink payload given as bytes (a netconfmsg, padded).
type rawData []byte

func (r rawData) Len() int          { return len(r) }
func (r rawData) Serialize() []byte { return r }
