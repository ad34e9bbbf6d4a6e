package vxlan

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrChanged: the device, or something bound to it, may have changed
// since Arm read it; RecreateArmed touched nothing.
var ErrChanged = errors.New("changed since it was read ahead")

// IsChanged reports whether err says an armed read went stale.
func IsChanged(err error) bool { return errors.Is(err, ErrChanged) }

// Armed is a device read ahead of a Recreate that runs later (at a commit
// instant), with a watch on the device from before that read.
//
// Arm and RecreateArmed split Recreate so that its reads (the device and
// everything bound to it: about ten netlink dumps, and as many again to
// top the prebuilt device up) are done while the agent waits for the
// instant, not between the instant and the flip, where each millisecond
// is a millisecond of the cluster's effect spread. The watch is a netlink
// socket joined to the link, address, neighbour (FDB included) and route
// groups before the read, so any change the CNI makes to the device after
// that read is queued on it: at the instant RecreateArmed reads it without
// waiting and, if anything may concern the device, refuses (ErrChanged,
// nothing touched), and the caller reads afresh and calls Recreate as
// before. So entries the CNI adds between the early read and the flip are
// never lost: they either make the watch fire or are already in the read.
type Armed struct {
	// Snap is the device as Arm read it.
	Snap Snapshot
	port int
	mon  *nl.NetlinkSocket
	// adopt is the prebuilt device, topped up to Snap; nil: none was
	// adoptable, RecreateArmed builds one from Snap.
	adopt *netlink.Vxlan
	// stale says why Snap may be out of date already ("": it is not).
	stale string
	// gen is the Fake's change counter at the read.
	gen uint64
}

// Close stops the watch. RecreateArmed closes it too; Close after that is
// a no-op.
func (a *Armed) Close() {
	if a != nil && a.mon != nil {
		a.mon.Close()
		a.mon = nil
	}
}

// armAttempts bounds how often Arm reads again when its watch saw the
// device change while it read: a device that keeps changing is left to
// the fresh read at the instant.
const armAttempts = 3

// Arm implements Interface.
func (k *Kernel) Arm(ctx context.Context, name string, newPort int) (*Armed, error) {
	if err := validPort("newPort", newPort); err != nil {
		return nil, &Error{Op: "arm", Device: name, Err: err}
	}
	// Joined before the read: a change after the read's dumps cannot
	// slip between them and the watch.
	mon, err := nl.SubscribeAt(k.ns, netns.None(), unix.NETLINK_ROUTE,
		unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
		unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	if err != nil {
		return nil, &Error{Op: "arm", Device: name, Err: fmt.Errorf("watch: %w", err)}
	}
	// Room for a burst of the CNI's changes; an overflow only costs the
	// fresh read (ENOBUFS counts as a change).
	_ = mon.SetReceiveBufferSize(1<<20, false)
	a := &Armed{port: newPort, mon: mon}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			a.Close()
			return nil, &Error{Op: "arm", Device: name, Err: err}
		}
		if err := k.armRead(a, name); err != nil {
			a.Close()
			return nil, err
		}
		// What the read and the top-up raced with: the top-up's own
		// changes to the prebuilt device are expected, anything on the
		// device itself means the read may have missed it.
		why := k.watchSaw(a, true)
		if why == "" {
			return a, nil
		}
		if attempt == armAttempts {
			a.stale = why
			return a, nil
		}
	}
}

// armRead reads the device into a, and tops the device Prebuild made up
// to that read, removing the last operation's old device on the way as
// Recreate would.
func (k *Kernel) armRead(a *Armed, name string) error {
	v, err := k.link("arm", name)
	if err != nil {
		return err
	}
	if a.Snap, err = k.snapshotOf(v); err != nil {
		return err
	}
	a.adopt = nil
	if v.Port == a.port || (k.Strategy != "" && k.Strategy != StrategyPrebuilt) {
		return nil // a replay, or no prebuilt device to prepare: Recreate decides
	}
	if err := a.Snap.Validate(); err != nil {
		return err
	}
	adopt := k.adoptable(a.Snap, tmpName(name), a.port)
	if adopt == nil {
		return nil
	}
	if err := k.removeLeftovers(oldName(name)); err != nil {
		return &Error{Op: "arm", Device: name, Err: err}
	}
	if !k.testNoTopUp {
		if _, err := k.topUp(a.Snap, adopt); err != nil {
			return &Error{Op: "arm", Device: name, Err: fmt.Errorf("top up the prebuilt %s: %w", adopt.Attrs().Name, err)}
		}
	}
	a.adopt = adopt
	return nil
}

// RecreateArmed implements Interface.
func (k *Kernel) RecreateArmed(a *Armed) (Window, error) {
	name := a.Snap.Device.Name
	changed := func(why string) (Window, error) {
		return Window{}, &Error{Op: "recreate", Device: name, Err: fmt.Errorf("%w: %s", ErrChanged, why)}
	}
	why := a.stale
	if why == "" {
		why = k.watchSaw(a, false)
	}
	a.Close()
	if why != "" && !k.testBlindWatch {
		return changed(why)
	}
	// The watch covers the link too; this one lookup is also the old
	// device the switch renames away.
	old, err := k.link("recreate", name)
	if err != nil {
		return changed(err.Error())
	}
	dev, err := k.deviceOf(old)
	if err != nil {
		return changed(err.Error())
	}
	if dev.Index != a.Snap.Device.Index || (Snapshot{Device: dev}).Text() != (Snapshot{Device: a.Snap.Device}).Text() {
		return changed(fmt.Sprintf("device now %q (index %d)", (Snapshot{Device: dev}).Text(), dev.Index))
	}
	if a.adopt == nil {
		return k.Recreate(a.Snap, a.port)
	}
	t0 := k.now()
	if _, err := k.restoreAddrs(a.adopt, a.Snap.Addrs); err != nil {
		return Window{}, &Error{Op: "recreate", Device: name, Err: err}
	}
	w := Window{Strategy: StrategyPrebuilt, Adopted: true, Prepare: k.now().Sub(t0)}
	return k.switchTo(a.Snap, old, a.adopt, w)
}

// watchSaw drains the watch without waiting and says what it saw that may
// concern the device ("": nothing). duringArm: the prebuilt device's
// neighbour and FDB changes are Arm's own top-up.
func (k *Kernel) watchSaw(a *Armed, duringArm bool) string {
	if a.mon == nil {
		return "no watch"
	}
	name := a.Snap.Device.Name
	dev, tmp := a.Snap.Device.Index, -1
	if a.adopt != nil {
		tmp = a.adopt.Attrs().Index
	}
	ours := map[string]bool{name: true, tmpName(name): true, oldName(name): true}
	buf := make([]byte, 1<<16)
	why := ""
	for {
		n, _, err := unix.Recvfrom(a.mon.GetFd(), buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return why
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// ENOBUFS: the socket overflowed and events were lost.
			return "watch: " + err.Error()
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return "watch: parse: " + err.Error()
		}
		for _, m := range msgs {
			if why != "" {
				continue // drained on, so that the socket holds nothing stale
			}
			why = concerns(m, dev, tmp, ours, duringArm)
		}
	}
}

// concerns says how m may concern the device (index dev) or the prebuilt
// one (tmp), or "" when it does not. Unknown shapes count as a change:
// a wrong "changed" costs a fresh read, a wrong "unchanged" an entry.
func concerns(m syscall.NetlinkMessage, dev, tmp int, ours map[string]bool, duringArm bool) string {
	idx := func(off int) int {
		if len(m.Data) < off+4 {
			return dev
		}
		return int(int32(binary.NativeEndian.Uint32(m.Data[off : off+4])))
	}
	typ := m.Header.Type
	switch typ {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		i := idx(4)
		if i == dev || i == tmp {
			return fmt.Sprintf("link event %d on index %d", typ, i)
		}
		if len(m.Data) < unix.SizeofIfInfomsg {
			return "short link event"
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			return "link event: " + err.Error()
		}
		for _, at := range attrs {
			if at.Attr.Type == unix.IFLA_IFNAME && ours[string(trimNUL(at.Value))] {
				return fmt.Sprintf("link event %d for %s", typ, trimNUL(at.Value))
			}
		}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		if i := idx(4); i == dev || i == tmp {
			return fmt.Sprintf("address event %d on index %d", typ, i)
		}
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		i := idx(4)
		if i == dev || (i == tmp && !duringArm) {
			return fmt.Sprintf("neighbour/FDB event %d on index %d", typ, i)
		}
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		if len(m.Data) < unix.SizeofRtMsg {
			return "short route event"
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofRtMsg:])
		if err != nil {
			return "route event: " + err.Error()
		}
		for _, at := range attrs {
			switch at.Attr.Type {
			case unix.RTA_OIF:
				if len(at.Value) >= 4 {
					if i := int(int32(binary.NativeEndian.Uint32(at.Value))); i == dev || i == tmp {
						return fmt.Sprintf("route event %d on index %d", typ, i)
					}
				}
			case unix.RTA_MULTIPATH:
				return fmt.Sprintf("multipath route event %d", typ)
			}
		}
	case unix.NLMSG_ERROR, unix.NLMSG_OVERRUN:
		return fmt.Sprintf("watch: message type %d", typ)
	}
	return ""
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// Link implements Interface: one request.
func (k *Kernel) Link(name string) (Device, error) {
	v, err := k.link("link", name)
	if err != nil {
		return Device{}, err
	}
	d, err := k.deviceOf(v)
	if err != nil {
		return Device{}, &Error{Op: "link", Device: name, Err: err}
	}
	return d, nil
}
