package vxlan

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/cutover-dev/cutover/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// netlink v1.3.1 neither sends nor parses NDA_PORT, and has no request that
// renames and raises a link at once, so these few messages are built here,
// on our own route socket in the target namespace.

const ndmsgLen = 12 // struct ndmsg

func (k *Kernel) request(typ, flags int, data ...nl.NetlinkRequestData) *nl.NetlinkRequest {
	req := &nl.NetlinkRequest{
		NlMsghdr: unix.NlMsghdr{
			Len:   uint32(unix.SizeofNlMsghdr),
			Type:  uint16(typ),
			Flags: unix.NLM_F_REQUEST | uint16(flags),
		},
		Sockets: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: k.sock},
	}
	for _, d := range data {
		req.AddData(d)
	}
	return req
}

// fdbList dumps the bridge FDB and keeps the entries of ifindex that belong
// to the VXLAN device itself (NTF_SELF), not those a master bridge keeps for
// it.
func (k *Kernel) fdbList(ifindex int) ([]FDBEntry, error) {
	msgs, err := netlinksafe.Retry(netlinksafe.Attempts, "bridge fdb", func() ([][]byte, error) {
		return k.request(unix.RTM_GETNEIGH, unix.NLM_F_DUMP, &netlink.Ndmsg{Family: unix.AF_BRIDGE}).
			Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	})
	if err != nil {
		return nil, fmt.Errorf("fdb dump: %w", err)
	}
	var out []FDBEntry
	for _, m := range msgs {
		if len(m) < ndmsgLen {
			continue
		}
		idx := int(int32(binary.NativeEndian.Uint32(m[4:8])))
		state := int(binary.NativeEndian.Uint16(m[8:10]))
		flags := int(m[10])
		if idx != ifindex || flags&netlink.NTF_MASTER != 0 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[ndmsgLen:])
		if err != nil {
			return nil, fmt.Errorf("fdb dump: parse: %w", err)
		}
		e := FDBEntry{State: state, Flags: flags}
		for _, a := range attrs {
			switch a.Attr.Type {
			case netlink.NDA_LLADDR:
				e.MAC = net.HardwareAddr(a.Value).String()
			case netlink.NDA_DST:
				e.Dst = net.IP(append([]byte(nil), a.Value...))
			case netlink.NDA_PORT:
				if len(a.Value) >= 2 {
					e.Port = int(binary.BigEndian.Uint16(a.Value))
				}
			case netlink.NDA_VNI:
				if len(a.Value) >= 4 {
					e.VNI = int(binary.NativeEndian.Uint32(a.Value))
				}
			case netlink.NDA_IFINDEX:
				if len(a.Value) >= 4 {
					e.Ifindex = int(binary.NativeEndian.Uint32(a.Value))
				}
			}
		}
		if e.Dst == nil {
			continue // a local entry (the device's own MAC), not a remote
		}
		out = append(out, e)
	}
	return out, nil
}

// fdbSend adds (RTM_NEWNEIGH) or deletes (RTM_DELNEIGH) one FDB remote.
func (k *Kernel) fdbSend(typ, flags, ifindex int, e FDBEntry) error {
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return fmt.Errorf("fdb entry mac %q: %w", e.MAC, err)
	}
	state := e.State
	if state == 0 {
		state = netlink.NUD_PERMANENT
	}
	fl := e.Flags &^ netlink.NTF_MASTER
	fl |= netlink.NTF_SELF
	req := k.request(typ, flags|unix.NLM_F_ACK, &netlink.Ndmsg{
		Family: unix.AF_BRIDGE, Index: uint32(ifindex), State: uint16(state), Flags: uint8(fl),
	})
	dst := e.Dst.To4()
	if dst == nil {
		dst = e.Dst.To16()
	}
	req.AddData(nl.NewRtAttr(netlink.NDA_LLADDR, mac))
	req.AddData(nl.NewRtAttr(netlink.NDA_DST, dst))
	if e.Port != 0 {
		p := make([]byte, 2)
		binary.BigEndian.PutUint16(p, uint16(e.Port))
		req.AddData(nl.NewRtAttr(netlink.NDA_PORT, p))
	}
	if e.VNI != 0 {
		req.AddData(nl.NewRtAttr(netlink.NDA_VNI, nl.Uint32Attr(uint32(e.VNI))))
	}
	if e.Ifindex != 0 {
		req.AddData(nl.NewRtAttr(netlink.NDA_IFINDEX, nl.Uint32Attr(uint32(e.Ifindex))))
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("fdb %s %s dst %s port %d: %w", opName(typ, flags), e.MAC, e.Dst, e.Port, err)
	}
	return nil
}

func opName(typ, flags int) string {
	switch {
	case typ == unix.RTM_DELNEIGH:
		return "del"
	case flags&unix.NLM_F_REPLACE != 0:
		return "replace"
	default:
		return "append"
	}
}

// setNameUp renames the link and raises it in one RTM_NEWLINK: the kernel's
// do_setlink applies IFLA_IFNAME before the flags, so the rename (which needs
// the link down) and the up happen in one request.
func (k *Kernel) setNameUp(ifindex int, name string) error {
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	msg.Flags = unix.IFF_UP
	msg.Change = unix.IFF_UP
	req := k.request(unix.RTM_NEWLINK, unix.NLM_F_ACK, msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("link index %d: set name %s up: %w", ifindex, name, err)
	}
	return nil
}
