package vxlan

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Kernel drives the VXLAN devices of one network namespace through netlink
// sockets opened in that namespace, so the caller's threads never move.
type Kernel struct {
	H    *netlink.Handle
	sock *nl.SocketHandle
	// ns is the namespace the sockets were opened in (netns.None(): the
	// caller's own), kept so that Arm can open its watch there too.
	ns netns.NsHandle
	// Strategy is StrategyPrebuilt (default when empty) or StrategyDeleteFirst.
	Strategy string
	// KeepOld leaves the old device, renamed to OldName and stripped of its
	// addresses and routes, for Cleanup instead of deleting it at the end
	// of Recreate. Deleting a link holds the kernel's global RTNL lock for
	// tens of milliseconds (RCU grace periods): done at once it delays the
	// Commit answer, and where several nodes share a kernel (a lab, or
	// many VXLAN devices on one host) it delays the others' flips. A
	// replayed or reverse Recreate removes a leftover old device first.
	KeepOld bool
	// now is the clock for Window; tests may stub it.
	now func() time.Time
	// testNoTopUp adopts a prebuilt device as it is (TestTopUpBites).
	testNoTopUp bool
	// testLooseRPFilter has Listen leave loose reverse-path filtering on
	// the receiver instead of turning it off (TestStagedRPFilterBites).
	testLooseRPFilter bool
	// testStep, when set, is called after each change the switch makes
	// (TestRetireEveryStepForwards pauses there, as a preempted
	// agent would).
	testStep func(step string)
	// testAddrsFirst strips the old device's addresses before the routes
	// move, the order before the fix (TestRetireEveryStepForwardsBites).
	testAddrsFirst bool
	// testBlindWatch has RecreateArmed ignore what its watch saw
	// (TestArmedWatchBites).
	testBlindWatch bool
}

// step marks a point between two changes of the switch, named what and
// its object. The name is built only for a test: the switch is the commit
// path's window.
func (k *Kernel) step(what, object string) {
	if k.testStep != nil {
		k.testStep(strings.TrimSpace(what + " " + object))
	}
}

var _ Interface = (*Kernel)(nil)

// Open returns a Kernel for the named namespace; "" means the caller's own
// (the host namespace for the agent).
func Open(nsName string) (*Kernel, error) {
	if nsName == "" {
		return New(netns.None())
	}
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		return nil, fmt.Errorf("vxlan: netns %q: %w", nsName, err)
	}
	defer func() { _ = ns.Close() }()
	return New(ns)
}

// New returns a Kernel for the namespace ns (netns.None() for the caller's
// own). The caller may close ns afterwards; the sockets keep the namespace.
func New(ns netns.NsHandle) (*Kernel, error) {
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("vxlan: netlink handle: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("vxlan: route socket: %w", err)
	}
	own := netns.None()
	if ns.IsOpen() {
		fd, err := unix.Dup(int(ns))
		if err != nil {
			h.Close()
			s.Close()
			return nil, fmt.Errorf("vxlan: keep the namespace handle: %w", err)
		}
		own = netns.NsHandle(fd)
	}
	return &Kernel{H: h, sock: &nl.SocketHandle{Socket: s}, ns: own, now: time.Now}, nil
}

// Close releases the netlink sockets.
func (k *Kernel) Close() {
	k.H.Close()
	k.sock.Close()
	if k.ns.IsOpen() {
		_ = k.ns.Close()
	}
}

// link returns the named link as a VXLAN device, with typed errors.
func (k *Kernel) link(op, name string) (*netlink.Vxlan, error) {
	l, err := netlinksafe.LinkByName(k.H, name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, &Error{Op: op, Device: name, Err: fmt.Errorf("%w (%w)", ErrNotFound, err)}
		}
		return nil, &Error{Op: op, Device: name, Err: err}
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return nil, &Error{Op: op, Device: name, Err: fmt.Errorf("%w: link type is %q", ErrNotVXLAN, l.Type())}
	}
	return v, nil
}

// Snapshot implements Interface.
func (k *Kernel) Snapshot(name string) (Snapshot, error) {
	v, err := k.link("snapshot", name)
	if err != nil {
		return Snapshot{}, err
	}
	return k.snapshotOf(v)
}

// snapshotOf reads what hangs off an already looked-up device.
func (k *Kernel) snapshotOf(v *netlink.Vxlan) (Snapshot, error) {
	a := v.Attrs()
	wrap := func(err error) error { return &Error{Op: "snapshot", Device: a.Name, Err: err} }
	dev, err := k.deviceOf(v)
	if err != nil {
		return Snapshot{}, wrap(err)
	}
	s := Snapshot{Device: dev}
	addrs, err := netlinksafe.AddrList(k.H, v, netlink.FAMILY_ALL)
	if err != nil {
		return Snapshot{}, wrap(err)
	}
	for _, ad := range addrs {
		if ad.IP.To4() == nil && ad.IP.IsLinkLocalUnicast() {
			continue // generated from the MAC, which the new device keeps
		}
		x := Addr{CIDR: ad.IPNet.String(), Scope: ad.Scope, Flags: ad.Flags &^ transientAddrFlags}
		if ad.Peer != nil && !ad.Peer.IP.Equal(ad.IP) {
			x.Peer = ad.Peer.String()
		}
		s.Addrs = append(s.Addrs, x)
	}
	if s.FDB, err = k.fdbList(a.Index); err != nil {
		return Snapshot{}, wrap(err)
	}
	if s.Neighbors, err = k.neighbors(a.Index); err != nil {
		return Snapshot{}, wrap(err)
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(k.H, fam, &netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			return Snapshot{}, wrap(err)
		}
		for _, r := range rs {
			if r.Protocol == unix.RTPROT_KERNEL || r.Table == unix.RT_TABLE_LOCAL {
				continue // derived from addresses; they come back with them
			}
			x := Route{Dst: "default", Gw: r.Gw, Src: r.Src, Family: r.Family, Table: r.Table, Protocol: int(r.Protocol),
				Scope: int(r.Scope), Type: r.Type, Priority: r.Priority, Flags: r.Flags, MTU: r.MTU}
			if r.Dst != nil {
				x.Dst = r.Dst.String()
			}
			s.Routes = append(s.Routes, x)
		}
	}
	return s, nil
}

// deviceOf reads a device's configuration (one request when it is pinned
// to an underlay device, for that device's name; none otherwise).
func (k *Kernel) deviceOf(v *netlink.Vxlan) (Device, error) {
	a := v.Attrs()
	d := Device{
		Name: a.Name, Index: a.Index, MTU: a.MTU, MAC: a.HardwareAddr.String(), TxQLen: a.TxQLen,
		Up:  a.Flags&net.FlagUp != 0,
		VNI: v.VxlanId, Port: v.Port, Local: v.SrcAddr, Group: v.Group, TTL: v.TTL, TOS: v.TOS,
		Learning: v.Learning, Proxy: v.Proxy, RSC: v.RSC, L2Miss: v.L2miss, L3Miss: v.L3miss,
		UDPCsum: v.UDPCSum, UDP6ZeroTx: v.UDP6ZeroCSumTx, UDP6ZeroRx: v.UDP6ZeroCSumRx,
		NoAge: v.NoAge, GBP: v.GBP, FlowBased: v.FlowBased, Age: v.Age, Limit: v.Limit,
		SrcPortLow: v.PortLow, SrcPortHigh: v.PortHigh,
	}
	if v.VtepDevIndex != 0 {
		p, err := netlinksafe.LinkByIndex(k.H, v.VtepDevIndex)
		if err != nil {
			return Device{}, fmt.Errorf("vtep device index %d: %w", v.VtepDevIndex, err)
		}
		d.VtepDev = p.Attrs().Name
	}
	return d, nil
}

// neighbors reads the device's ARP/NDP entries worth restoring. Per
// family: an AF_UNSPEC neighbour dump would also return the bridge FDB.
func (k *Kernel) neighbors(idx int) ([]Neighbor, error) {
	var out []Neighbor
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		ns, err := netlinksafe.NeighList(k.H, idx, fam)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			if len(n.HardwareAddr) == 0 || n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED|netlink.NUD_NOARP) != 0 {
				continue // nothing worth restoring
			}
			out = append(out, Neighbor{IP: n.IP, MAC: n.HardwareAddr.String(), State: n.State, Flags: n.Flags})
		}
	}
	return out, nil
}

// Addresses flags that describe a moment (DAD in progress), not configuration.
const transientAddrFlags = unix.IFA_F_TENTATIVE | unix.IFA_F_DADFAILED | unix.IFA_F_OPTIMISTIC

// tmpName is where the new device is built. Derived from the name so that a
// leftover from an interrupted Recreate is found and removed on replay.
func tmpName(name string) string { return derivedName("cotx", name) }

// TmpName is where Prebuild builds the new device: a rolled-back operation
// may leave it (down, holding no socket) until the next one.
func TmpName(name string) string { return tmpName(name) }

// OldName is where the old device waits for deletion after the switch: a
// port check may see it holding the old port until Cleanup.
func OldName(name string) string { return oldName(name) }

// oldName is where the old device waits for deletion after the switch.
func oldName(name string) string { return derivedName("cotd", name) }

func derivedName(prefix, name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return fmt.Sprintf("%s%08x", prefix, h.Sum32())
}

func newLink(d Device, name string, port int, vtepIndex int) (*netlink.Vxlan, error) {
	mac, err := net.ParseMAC(d.MAC)
	if err != nil {
		return nil, fmt.Errorf("device.mac %q: %w", d.MAC, err)
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU, la.HardwareAddr, la.TxQLen = name, d.MTU, mac, d.TxQLen
	return &netlink.Vxlan{
		LinkAttrs: la, VxlanId: d.VNI, VtepDevIndex: vtepIndex, SrcAddr: d.Local, Group: d.Group,
		TTL: d.TTL, TOS: d.TOS, Learning: d.Learning, Proxy: d.Proxy, RSC: d.RSC, L2miss: d.L2Miss, L3miss: d.L3Miss,
		UDPCSum: d.UDPCsum, UDP6ZeroCSumTx: d.UDP6ZeroTx, UDP6ZeroCSumRx: d.UDP6ZeroRx, NoAge: d.NoAge, GBP: d.GBP,
		FlowBased: d.FlowBased, Age: d.Age, Limit: d.Limit, Port: port, PortLow: d.SrcPortLow, PortHigh: d.SrcPortHigh,
	}, nil
}

// Recreate implements Interface. See the package documentation for the
// strategies and what they measured.
func (k *Kernel) Recreate(snap Snapshot, newPort int) (Window, error) {
	name := snap.Device.Name
	if err := snap.Validate(); err != nil {
		return Window{}, err
	}
	if err := validPort("newPort", newPort); err != nil {
		return Window{}, &Error{Op: "recreate", Device: name, Err: err}
	}
	fail := func(err error) (Window, error) { return Window{}, &Error{Op: "recreate", Device: name, Err: err} }

	old, err := k.link("recreate", name)
	switch {
	case IsNotFound(err):
		old = nil // a replay after the delete: build it again
	case err != nil:
		return Window{}, err
	default:
		// Replay after success: nothing to do, and no window to pay. Only
		// a device already on newPort can be that replay: a flip (this
		// runs after the commit instant) skips the full dump.
		if old.Port != newPort {
			break
		}
		if cur, err := k.snapshotOf(old); err == nil && cur.Text() == withPort(snap, newPort).Text() {
			return Window{Strategy: "noop"}, nil
		}
	}
	tmp := tmpName(name)
	var adopt *netlink.Vxlan
	if k.Strategy == "" || k.Strategy == StrategyPrebuilt {
		adopt = k.adoptable(snap, tmp, newPort)
	}
	leftovers := []string{oldName(name)}
	if adopt == nil {
		leftovers = append(leftovers, tmp)
	}
	if err := k.removeLeftovers(leftovers...); err != nil {
		return fail(err)
	}
	switch k.Strategy {
	case "", StrategyPrebuilt:
		if adopt != nil {
			return k.switchAdopted(snap, old, adopt, newPort)
		}
		return k.recreatePrebuilt(snap, old, tmp, newPort)
	case StrategyDeleteFirst:
		return k.recreateDeleteFirst(snap, old, newPort)
	default:
		return fail(fmt.Errorf("strategy %q: must be %q or %q", k.Strategy, StrategyPrebuilt, StrategyDeleteFirst))
	}
}

func withPort(s Snapshot, port int) Snapshot {
	s.Device.Port = port
	return s
}

// removeLeftovers deletes devices of ours left under the given names.
func (k *Kernel) removeLeftovers(names ...string) error {
	for _, left := range names {
		if l, err := k.H.LinkByName(left); err == nil {
			if _, ok := l.(*netlink.Vxlan); !ok {
				return fmt.Errorf("%s exists and is a %s link, not a leftover of ours; remove it", left, l.Type())
			}
			if err := k.H.LinkDel(l); err != nil {
				return fmt.Errorf("remove leftover %s: %w", left, err)
			}
		}
	}
	return nil
}

// Prebuild implements Interface.
func (k *Kernel) Prebuild(snap Snapshot, newPort int) (Window, error) {
	name := snap.Device.Name
	fail := func(err error) (Window, error) { return Window{}, &Error{Op: "prebuild", Device: name, Err: err} }
	if err := snap.Validate(); err != nil {
		return Window{}, err
	}
	if err := validPort("newPort", newPort); err != nil {
		return fail(err)
	}
	t0 := k.now()
	tmp := tmpName(name)
	if k.adoptable(snap, tmp, newPort) != nil {
		return Window{Strategy: StrategyPrebuilt, Prepare: k.now().Sub(t0)}, nil // a replayed Prepare
	}
	// The last operation's leftovers go now rather than at the commit
	// instant: its old device may still hold the VNI on newPort (after a
	// rollback), which the kernel refuses to duplicate (EEXIST).
	if err := k.removeLeftovers(oldName(name), tmp); err != nil {
		return fail(err)
	}
	if _, err := k.buildTmp(snap, tmp, newPort, false); err != nil {
		return fail(err)
	}
	return Window{Strategy: StrategyPrebuilt, Prepare: k.now().Sub(t0)}, nil
}

// buildTmp adds the new device under tmp, down, with snap's FDB and
// neighbours, and with its addresses when withAddrs. Everything bound to
// the ifindex can be attached while the device is down and the old one
// still carries traffic; routes cannot (IPv4 refuses a nexthop on a down
// device), so they wait for the window.
func (k *Kernel) buildTmp(snap Snapshot, tmp string, port int, withAddrs bool) (*netlink.Vxlan, error) {
	vtep, err := k.vtepIndex(snap.Device)
	if err != nil {
		return nil, err
	}
	nlink, err := newLink(snap.Device, tmp, port, vtep)
	if err != nil {
		return nil, err
	}
	if err := k.H.LinkAdd(nlink); err != nil {
		return nil, fmt.Errorf("add %s (vxlan id %d dstport %d): %w", tmp, snap.Device.VNI, port, err)
	}
	idx := nlink.Attrs().Index
	if withAddrs {
		if _, err := k.restoreAddrs(nlink, snap.Addrs); err != nil {
			return nil, err
		}
	}
	if _, err := k.restoreFDB(idx, snap.FDB); err != nil {
		return nil, err
	}
	if _, err := k.restoreNeighbors(idx, snap.Neighbors); err != nil {
		return nil, err
	}
	return nlink, nil
}

// vtepIndex is the ifindex of the underlay device d is pinned to (0: none).
func (k *Kernel) vtepIndex(d Device) (int, error) {
	if d.VtepDev == "" {
		return 0, nil
	}
	p, err := netlinksafe.LinkByName(k.H, d.VtepDev)
	if err != nil {
		return 0, fmt.Errorf("device.vtepDev %q: %w", d.VtepDev, err)
	}
	return p.Attrs().Index, nil
}

// adoptable returns the device Prebuild (down) or Listen (up) left under
// tmp if Recreate(snap, port) can use it: a VXLAN link without addresses,
// configured as snap's device on port. Anything else (another port, a leftover of an
// interrupted Recreate, a device changed since) is not adopted.
func (k *Kernel) adoptable(snap Snapshot, tmp string, port int) *netlink.Vxlan {
	l, err := k.H.LinkByName(tmp)
	if err != nil {
		return nil
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok || v.Port != port {
		return nil
	}
	// Only what identifies it: its configuration (one lookup for the vtep
	// device's name) and no addresses (one dump). Every request here runs
	// between the commit instant and the flip.
	dev, err := k.deviceOf(v)
	if err != nil {
		return nil
	}
	if addrs, err := netlinksafe.AddrList(k.H, v, netlink.FAMILY_V4); err != nil || len(addrs) != 0 {
		return nil
	}
	// Down as Prebuild leaves it, or up as Listen does (receiving).
	want := snap.Device
	want.Name, want.Index, want.Port, want.Up = tmp, dev.Index, port, dev.Up
	if (Snapshot{Device: dev}).Text() != (Snapshot{Device: want}).Text() {
		return nil
	}
	return v
}

// topUp brings the adopted device's FDB and neighbours in line with snap,
// the device as read just before the switch: what the CNI added, changed or
// removed since Prebuild. It returns how many requests that took.
func (k *Kernel) topUp(snap Snapshot, v *netlink.Vxlan) (int, error) {
	idx := v.Attrs().Index
	var cur Snapshot
	var err error
	if cur.FDB, err = k.fdbList(idx); err != nil {
		return 0, err
	}
	if cur.Neighbors, err = k.neighbors(idx); err != nil {
		return 0, err
	}
	calls := 0
	fdbKey := func(e FDBEntry) string {
		return fmt.Sprintf("%s|%s|%d|%d|%d|%d|%d", e.MAC, e.Dst, e.Port, e.VNI, e.Ifindex, e.State, e.Flags)
	}
	have := map[string]FDBEntry{}
	for _, e := range cur.FDB {
		have[fdbKey(e)] = e
	}
	want := map[string]bool{}
	for _, e := range snap.FDB {
		want[fdbKey(e)] = true
		if _, ok := have[fdbKey(e)]; !ok {
			calls++
			if err := k.fdbSend(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_APPEND, idx, e); err != nil {
				return calls, err
			}
		}
	}
	for key, e := range have {
		if !want[key] {
			if e.Port == 0 {
				e.Port = v.Port
			}
			calls++
			if err := k.fdbSend(unix.RTM_DELNEIGH, 0, idx, e); err != nil {
				return calls, err
			}
		}
	}
	haveN := map[string]Neighbor{}
	for _, n := range cur.Neighbors {
		haveN[n.IP.String()] = n
	}
	wantN := map[string]bool{}
	var add []Neighbor
	for _, n := range snap.Neighbors {
		wantN[n.IP.String()] = true
		if h, ok := haveN[n.IP.String()]; !ok || h.MAC != n.MAC || h.State != n.State || h.Flags != n.Flags {
			add = append(add, n)
		}
	}
	n, err := k.restoreNeighbors(idx, add)
	calls += n
	if err != nil {
		return calls, err
	}
	for ip, h := range haveN {
		if wantN[ip] {
			continue
		}
		fam := netlink.FAMILY_V4
		if h.IP.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		calls++
		if err := k.H.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: fam, IP: h.IP}); err != nil && !errors.Is(err, unix.ENOENT) {
			return calls, fmt.Errorf("neigh del %s: %w", h.IP, err)
		}
	}
	return calls, nil
}

// switchAdopted is recreatePrebuilt with the new device Prebuild made: it
// is topped up to snap and given its addresses (still before the old device
// is touched), then switched in the same way.
func (k *Kernel) switchAdopted(snap Snapshot, old, v *netlink.Vxlan, port int) (Window, error) {
	fail := func(err error) (Window, error) {
		return Window{}, &Error{Op: "recreate", Device: snap.Device.Name, Err: err}
	}
	t0 := k.now()
	if !k.testNoTopUp {
		if _, err := k.topUp(snap, v); err != nil {
			return fail(fmt.Errorf("top up the prebuilt %s: %w", v.Attrs().Name, err))
		}
	}

	if _, err := k.restoreAddrs(v, snap.Addrs); err != nil {
		return fail(err)
	}
	w := Window{Strategy: StrategyPrebuilt, Adopted: true, Prepare: k.now().Sub(t0)}
	return k.switchTo(snap, old, v, w)
}

func (k *Kernel) recreatePrebuilt(snap Snapshot, old *netlink.Vxlan, tmp string, port int) (Window, error) {
	name := snap.Device.Name
	fail := func(err error) (Window, error) { return Window{}, &Error{Op: "recreate", Device: name, Err: err} }
	t0 := k.now()
	nlink, err := k.buildTmp(snap, tmp, port, true)
	if err != nil {
		return fail(err)
	}
	w := Window{Strategy: StrategyPrebuilt, Prepare: k.now().Sub(t0)}
	return k.switchTo(snap, old, nlink, w)
}

// switchTo puts nlink, built and addressed under its temporary name, in
// old's place: the window.
func (k *Kernel) switchTo(snap Snapshot, old, nlink *netlink.Vxlan, w Window) (Window, error) {
	name := snap.Device.Name
	fail := func(err error) (Window, error) { return Window{}, &Error{Op: "recreate", Device: name, Err: err} }
	idx := nlink.Attrs().Index
	var err error

	// Deleting a link costs 10-50 ms (unregistering waits for RCU grace
	// periods) and taking it down 3-10 ms (the vxlan socket release waits
	// for one), so neither happens inside the window if the kernel allows
	// renaming a running link: the old device is renamed away while up, the
	// new one takes the name and comes up, the old one loses its addresses
	// (so its connected routes stop attracting traffic) and the routes move
	// over by replace. Older kernels refuse the live rename (EBUSY); then
	// the old device is taken down first. It is deleted after the window.
	tDel := k.now()
	if old != nil {
		err := k.H.LinkSetName(old, oldName(name))
		w.Calls++
		if err != nil && old.Flags&net.FlagUp != 0 {
			if err := k.H.LinkSetDown(old); err != nil {
				return fail(fmt.Errorf("set old device (index %d) down: %w", old.Index, err))
			}
			old.Flags &^= net.FlagUp
			err = k.H.LinkSetName(old, oldName(name))
			w.Calls += 2
		}
		if err != nil {
			return fail(fmt.Errorf("rename old device (index %d) to %s: %w", old.Index, oldName(name), err))
		}
		k.step("old device renamed away", "")
	}
	if snap.Device.Up {
		err = k.setNameUp(idx, name)
		if errors.Is(err, unix.EBUSY) && nlink.Attrs().Flags&net.FlagUp != 0 {
			// A receiver Listen raised, on a kernel that refuses renaming
			// a running link: down for the rename (a gap of a few ms).
			if err = k.H.LinkSetDown(nlink); err == nil {
				err = k.setNameUp(idx, name)
			}
			w.Calls++
		}
	} else {
		err = k.H.LinkSetName(nlink, name)
	}
	if err != nil {
		return fail(err)
	}
	w.Calls++
	k.step("new device named", "")
	w.Absent = k.now().Sub(tDel)
	// The routes move before the old device loses its addresses: a device
	// losing its last IPv4 address has every route through it flushed
	// (fib_disable_ip), so the other order leaves the overlay's routes
	// missing until each is added again, and with flannel's layout (a /32
	// on the device, onlink routes) no route to any peer subnet: measured
	// with the agent paused 50 ms between steps, every datagram of that
	// gap lost (TestRetireEveryStepForwards). A replace swaps each route's
	// nexthop in one step, and the old device, still up, carries what its
	// connected routes attract until its addresses go.
	stripOld := func() error {
		if old == nil || old.Flags&net.FlagUp == 0 {
			return nil
		}
		for _, a := range snap.Addrs {
			ad, err := netlink.ParseAddr(a.CIDR)
			if err != nil {
				return fmt.Errorf("addr %q: %w", a.CIDR, err)
			}
			w.Calls++
			if err := k.H.AddrDel(old, ad); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("remove %s from the old device: %w", a.CIDR, err)
			}
			k.step("old device lost", a.CIDR)
		}
		return nil
	}
	if k.testAddrsFirst {
		if err := stripOld(); err != nil {
			return fail(err)
		}
	}
	n, err := k.restoreRoutes(idx, snap.Routes)
	w.Calls += n
	if err != nil {
		return fail(err)
	}
	if !k.testAddrsFirst {
		if err := stripOld(); err != nil {
			return fail(err)
		}
	}
	w.Total = k.now().Sub(tDel)
	w.Start, w.End = tDel, tDel.Add(w.Total)
	if old != nil && !k.KeepOld {
		tc := k.now()
		if err := k.H.LinkDel(old); err != nil {
			return w, &Error{Op: "recreate", Device: name, Err: fmt.Errorf("delete old device %s (index %d) after the switch: %w", oldName(name), old.Index, err)}
		}
		w.Cleanup = k.now().Sub(tc)
	}
	return w, nil
}

func (k *Kernel) recreateDeleteFirst(snap Snapshot, old *netlink.Vxlan, port int) (Window, error) {
	name := snap.Device.Name
	fail := func(err error) (Window, error) { return Window{}, &Error{Op: "recreate", Device: name, Err: err} }
	vtep, err := k.vtepIndex(snap.Device)
	if err != nil {
		return fail(err)
	}
	nlink, err := newLink(snap.Device, name, port, vtep)
	if err != nil {
		return fail(err)
	}
	w := Window{Strategy: StrategyDeleteFirst}
	tDel := k.now()
	if old != nil {
		if err := k.H.LinkDel(old); err != nil {
			return fail(fmt.Errorf("delete old device (index %d): %w", old.Index, err))
		}
		w.Calls++
	}
	if err := k.H.LinkAdd(nlink); err != nil {
		return fail(fmt.Errorf("add %s (vxlan id %d dstport %d): %w", name, snap.Device.VNI, port, err))
	}
	w.Calls += 2 // netlink looks the index up after the add
	idx := nlink.Attrs().Index
	for _, step := range []func() (int, error){
		func() (int, error) { return k.restoreAddrs(nlink, snap.Addrs) },
		func() (int, error) { return k.restoreFDB(idx, snap.FDB) },
		func() (int, error) { return k.restoreNeighbors(idx, snap.Neighbors) },
	} {
		n, err := step()
		w.Calls += n
		if err != nil {
			return fail(err)
		}
	}
	if snap.Device.Up {
		if err := k.H.LinkSetUp(nlink); err != nil {
			return fail(fmt.Errorf("set %s up: %w", name, err))
		}
		w.Calls++
	}
	w.Absent = k.now().Sub(tDel)
	n, err := k.restoreRoutes(idx, snap.Routes)
	w.Calls += n
	if err != nil {
		return fail(err)
	}
	w.Total = k.now().Sub(tDel)
	w.Start, w.End = tDel, tDel.Add(w.Total)
	return w, nil
}

func (k *Kernel) restoreAddrs(l netlink.Link, addrs []Addr) (int, error) {
	for i, a := range addrs {
		ad, err := netlink.ParseAddr(a.CIDR)
		if err != nil {
			return i, fmt.Errorf("addrs[%d].cidr %q: %w", i, a.CIDR, err)
		}
		if a.Peer != "" {
			if ad.Peer, err = netlink.ParseIPNet(a.Peer); err != nil {
				return i, fmt.Errorf("addrs[%d].peer %q: %w", i, a.Peer, err)
			}
		}
		ad.Scope, ad.Flags = a.Scope, a.Flags
		if err := k.H.AddrReplace(l, ad); err != nil {
			return i + 1, fmt.Errorf("addr %s: %w", a.CIDR, err)
		}
	}
	return len(addrs), nil
}

func (k *Kernel) restoreFDB(idx int, fdb []FDBEntry) (int, error) {
	for i, e := range fdb {
		if err := k.fdbSend(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_APPEND, idx, e); err != nil {
			return i + 1, err
		}
	}
	return len(fdb), nil
}

func (k *Kernel) restoreNeighbors(idx int, ns []Neighbor) (int, error) {
	for i, n := range ns {
		mac, err := net.ParseMAC(n.MAC)
		if err != nil {
			return i, fmt.Errorf("neighbors[%d].mac %q: %w", i, n.MAC, err)
		}
		fam := netlink.FAMILY_V4
		if n.IP.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		if err := k.H.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: fam, State: n.State, Flags: n.Flags, IP: n.IP, HardwareAddr: mac}); err != nil {
			return i + 1, fmt.Errorf("neigh %s lladdr %s: %w", n.IP, n.MAC, err)
		}
	}
	return len(ns), nil
}

func (k *Kernel) restoreRoutes(idx int, rs []Route) (int, error) {
	for i, r := range rs {
		nr := netlink.Route{LinkIndex: idx, Gw: r.Gw, Src: r.Src, Family: r.Family, Table: r.Table,
			Protocol: netlink.RouteProtocol(r.Protocol), Scope: netlink.Scope(r.Scope), Type: r.Type,
			Priority: r.Priority, Flags: r.Flags, MTU: r.MTU}
		if r.Dst != "default" {
			_, dst, err := net.ParseCIDR(r.Dst)
			if err != nil {
				return i, fmt.Errorf("routes[%d].dst %q: %w", i, r.Dst, err)
			}
			nr.Dst = dst
		}
		if err := k.H.RouteReplace(&nr); err != nil {
			return i + 1, fmt.Errorf("route %s via %s: %w", r.Dst, r.Gw, err)
		}
		k.step("route moved:", r.Dst)
	}
	return len(rs), nil
}

// SetFDBPorts implements Interface. A unicast MAC with one remote is
// rewritten with one replace; other entries (the all-zero flood entry, MACs
// with several remotes) get the new remote appended before the old one is
// deleted, so no peer is ever missing from it
// (for a moment a packet may go out on both ports).
func (k *Kernel) SetFDBPorts(snap Snapshot, port int) error {
	name := snap.Device.Name
	if port != 0 {
		if err := validPort("port", port); err != nil {
			return &Error{Op: "set-fdb-ports", Device: name, Err: err}
		}
	}
	v, err := k.link("set-fdb-ports", name)
	if err != nil {
		return err
	}
	fail := func(err error) error { return &Error{Op: "set-fdb-ports", Device: name, Err: err} }
	cur, err := k.fdbList(v.Index)
	if err != nil {
		return fail(err)
	}
	// The kernel reports no port for remotes on the device's own port.
	want := port
	if port == v.Port {
		want = 0
	}
	perMAC := map[string]int{}
	for _, e := range cur {
		perMAC[e.MAC]++
	}
	for _, e := range cur {
		if e.Port == want {
			continue
		}
		ne := e
		ne.Port = port
		if ne.Port == 0 {
			ne.Port = v.Port
		}
		// The kernel replaces in place only unicast MACs (EOPNOTSUPP for
		// the all-zero and multicast ones) and only their first remote.
		if perMAC[e.MAC] == 1 && unicast(e.MAC) {
			if err := k.fdbSend(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, v.Index, ne); err != nil {
				return fail(err)
			}
			continue
		}
		if err := k.fdbSend(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_APPEND, v.Index, ne); err != nil {
			return fail(err)
		}
		old := e
		if old.Port == 0 {
			old.Port = v.Port
		}
		if err := k.fdbSend(unix.RTM_DELNEIGH, 0, v.Index, old); err != nil {
			return fail(err)
		}
	}
	return nil
}

func unicast(mac string) bool {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) == 0 {
		return false
	}
	zero := true
	for _, c := range hw {
		if c != 0 {
			zero = false
		}
	}
	return !zero && hw[0]&1 == 0
}

// Cleanup implements Interface.
func (k *Kernel) Cleanup(name string) error {
	if err := k.cleanupOne(name, tmpName(name)); err != nil {
		return err
	}
	return k.cleanupOne(name, oldName(name))
}

func (k *Kernel) cleanupOne(name, old string) error {
	l, err := netlinksafe.LinkByName(k.H, old)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return &Error{Op: "cleanup", Device: name, Err: err}
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return &Error{Op: "cleanup", Device: name, Err: fmt.Errorf("%s is a %s link, not a device of ours; not deleting it", old, l.Type())}
	}
	if err := k.H.LinkDel(l); err != nil {
		return &Error{Op: "cleanup", Device: name, Err: fmt.Errorf("delete %s: %w", old, err)}
	}
	return nil
}
