package ovsvxlan

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// The staged strategy's receive ports and their redirect flows: where the
// tunnels are, which OpenFlow port numbers the receive ports take, the
// redirects that hand their frames to vxlan0's flows, and the standing
// redirects Keep maintains between operations. The phases in staged.go
// build on these; nothing here moves a tunnel.

// Cookies of the flows the staged strategy adds (no owner's flow uses them).
// CookieOut tagged the send copies of an earlier layout: an agent of this
// version still removes them when it undoes or retires.
const (
	CookieIn  uint64 = 0x0c07c07c07000001
	CookieOut uint64 = 0x0c07c07c07000002
)

// redirectPriority is the redirect flow's: above every owner's flow in
// table 0, so nothing else sees a packet of the receive port as such.
const redirectPriority = 65535

// RxName is the receive port's interface name for iface.
func RxName(iface string) string { return iface + "-cot" }

// stagedReady is why this agent cannot run the staged strategy, if it
// cannot.
func (b *Backend) stagedReady() error {
	if b.cfg.OF == nil {
		return fmt.Errorf("staged strategy: no OpenFlow access configured")
	}
	return nil
}

// rxOld is the name of the receive port a switched node keeps on the old
// port.
func rxOld(iface string) string { return iface + "-cot-old" }

// tunnels is where a staged node's tunnels are: vxlan0's port and ofport,
// and each receive port's (port 0: it does not exist).
type tunnels struct {
	tunnel, rx, old       tunnelport.Port
	ofport, rxOFP, oldOFP int64
}

// readTunnels reads vxlan0 and both receive ports.
func (b *Backend) readTunnels(ctx context.Context) (tunnels, error) {
	iface, err := b.getInterface(ctx)
	if err != nil {
		return tunnels{}, err
	}
	t := tunnels{ofport: iface.OFPort}
	if t.tunnel, err = dstPort(iface); err != nil {
		return t, err
	}
	for _, r := range []struct {
		name string
		port *tunnelport.Port
		ofp  *int64
	}{{RxName(b.cfg.Interface), &t.rx, &t.rxOFP}, {rxOld(b.cfg.Interface), &t.old, &t.oldOFP}} {
		i, err := b.cfg.OVS.GetInterface(ctx, r.name)
		switch {
		case ovs.IsNotFound(err):
			continue
		case err != nil:
			return t, fmt.Errorf("receive port %s: %w", r.name, err)
		}
		if *r.port, err = dstPort(i); err != nil {
			return t, err
		}
		if i.OFPort <= 0 {
			return t, fmt.Errorf("receive port %s has ofport %d (error %q)", i.Name, i.OFPort, i.Error)
		}
		*r.ofp = i.OFPort
	}
	return t, nil
}

// where names the tunnels' ports for an error.
func (b *Backend) where(t tunnels) string {
	on := func(p tunnelport.Port) string {
		if p == 0 {
			return "absent"
		}
		return "on port " + strconv.Itoa(int(p))
	}
	return fmt.Sprintf("%s is on port %d, %s %s, %s %s", b.cfg.Interface, t.tunnel,
		RxName(b.cfg.Interface), on(t.rx), rxOld(b.cfg.Interface), on(t.old))
}

// redirect is the flow that hands what arrives on OpenFlow port rxOFP to
// the owner's flows as vxlan0's (ofport).
func redirect(rxOFP, ofport int64) openflow.Flow {
	return openflow.Flow{Table: 0, Priority: redirectPriority, Cookie: CookieIn,
		Match:   []openflow.Field{{Key: "in_port", Value: strconv.FormatInt(rxOFP, 10)}},
		Actions: fmt.Sprintf("load:%#x->NXM_OF_IN_PORT[],resubmit(,0)", ofport)}
}

// redirected is which OpenFlow ports our redirects to vxlan0's ofport
// cover, and whether other flows of ours are there (a redirect to another
// ofport: vxlan0 recreated since; an earlier layout's copies).
func (b *Backend) redirected(ctx context.Context, ofport int64) (map[int64]bool, bool, error) {
	flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
	if err != nil {
		return nil, false, err
	}
	ports, others := map[int64]bool{}, false
	for _, f := range flows {
		if f.Cookie != CookieIn && f.Cookie != CookieOut {
			continue
		}
		if f.Cookie == CookieIn && f.Table == 0 && f.Priority == redirectPriority && len(f.Match) == 1 && f.Match[0].Key == "in_port" {
			if n, err := strconv.ParseInt(f.Match[0].Value, 10, 64); err == nil && f.Actions == redirect(n, ofport).Actions {
				ports[n] = true
				continue
			}
		}
		others = true
	}
	return ports, others, nil
}

// maxOFPort is the highest OpenFlow port number a port can request
// (0xfeff; above are OpenFlow's reserved ports).
const maxOFPort = 0xfeff

// usedOFPorts is every OpenFlow port number an interface of the bridge has
// or requests (OpenFlow numbers are the bridge's own).
func (b *Backend) usedOFPorts(ctx context.Context) (map[int64]bool, error) {
	ifs, err := b.cfg.OVS.Interfaces(ctx, b.cfg.Bridge)
	if err != nil {
		return nil, fmt.Errorf("ofports: %w", err)
	}
	used := map[int64]bool{}
	for _, i := range ifs {
		used[i.OFPort] = true
		if i.OFPortRequest != 0 {
			used[i.OFPortRequest] = true
		}
	}
	return used, nil
}

// rxNumbers picks the receive ports' OpenFlow port numbers, n and n+1:
// those of a pair of our redirects already in place (have: the standing
// ones) when no interface has either number, else two free ones.
func (b *Backend) rxNumbers(ctx context.Context, have map[int64]bool) (int64, error) {
	used, err := b.usedOFPorts(ctx)
	if err != nil {
		return 0, err
	}
	if n := freePair(have, used); n != 0 {
		return n, nil
	}
	return freeOFPorts(used)
}

// freePair is the highest n with redirects for n and n+1 and no interface
// on either number; 0 if none.
func freePair(have, used map[int64]bool) int64 {
	for _, n := range slices.Backward(slices.Sorted(maps.Keys(have))) {
		if have[n+1] && !used[n] && !used[n+1] {
			return n
		}
	}
	return 0
}

// freeOFPorts picks two consecutive OpenFlow port numbers no interface
// uses, from the top of the range down (OVS hands out numbers from the
// bottom), for the receive ports: the redirects of both go in at Listen, in
// one flow table change, though the old port's receiver is added only at
// the switch.
func freeOFPorts(used map[int64]bool) (int64, error) {
	for n := int64(maxOFPort - 1); n > 1; n-- {
		if !used[n] && !used[n+1] {
			return n, nil
		}
	}
	return 0, fmt.Errorf("no two free OpenFlow port numbers on the bridge")
}

// rxPort is a receive port: vxlan0's options but dst_port, bound to the
// node IP, at OpenFlow port ofport.
func (b *Backend) rxPort(sd snapshot, name string, port tunnelport.Port, ofport int64) ovs.Interface {
	options := maps.Clone(sd.Options)
	if options == nil {
		options = map[string]string{}
	}
	options["dst_port"], options["local_ip"] = strconv.Itoa(int(port)), b.cfg.RxLocalIP.String()
	return ovs.Interface{Name: name, Type: "vxlan", Options: options, OFPortRequest: ofport}
}

// delOurs deletes the flows with cookie in every table they are in.
func (b *Backend) delOurs(ctx context.Context, cookies ...uint64) error {
	flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for _, f := range flows {
		key := fmt.Sprintf("%d/%d", f.Table, f.Cookie)
		if !slices.Contains(cookies, f.Cookie) || done[key] {
			continue
		}
		done[key] = true
		if err := b.cfg.OF.DelFlows(ctx, b.cfg.Bridge, openflow.Flow{Table: f.Table, Cookie: f.Cookie}); err != nil {
			return err
		}
	}
	return nil
}

// Keep implements dataplane.Keeper: with StandingRedirects, the two
// redirect flows are in place for vxlan0's ofport at two OpenFlow port
// numbers no interface has. A no-op without StandingRedirects, with the
// openshift-sdn profile (the SDN owns br0's flows), and while an
// operation's receive ports exist (its listen keeps their flows).
func (b *Backend) Keep(ctx context.Context) (bool, error) {
	if !b.cfg.StandingRedirects || b.cfg.SDN || b.stagedReady() != nil {
		return false, nil
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	return b.keep(ctx)
}

// keep is Keep with b.staged held. It writes only what is wrong: nothing
// when the pair is in place, else every flow of ours goes (a stale
// redirect after vxlan0 was recreated, one for a number an interface took
// since: it would hand that interface's frames to vxlan0's flows; an
// earlier layout's copies) and the pair comes back at free numbers.
func (b *Backend) keep(ctx context.Context) (bool, error) {
	t, err := b.readTunnels(ctx)
	if err != nil {
		return false, fmt.Errorf("standing redirects: %w", err)
	}
	if t.rx != 0 || t.old != 0 {
		return false, nil
	}
	have, others, err := b.redirected(ctx, t.ofport)
	if err != nil {
		return false, fmt.Errorf("standing redirects: %w", err)
	}
	used, err := b.usedOFPorts(ctx)
	if err != nil {
		return false, fmt.Errorf("standing redirects: %w", err)
	}
	n := freePair(have, used)
	if n != 0 && !others && len(have) == 2 {
		return false, nil
	}
	if others || len(have) > 0 {
		if err := b.delOurs(ctx, CookieIn, CookieOut); err != nil {
			return true, fmt.Errorf("standing redirects: remove stale ones: %w", err)
		}
	}
	if n == 0 {
		if n, err = freeOFPorts(used); err != nil {
			return true, fmt.Errorf("standing redirects: %w", err)
		}
	}
	if err := b.cfg.OF.AddFlows(ctx, b.cfg.Bridge, []openflow.Flow{redirect(n, t.ofport), redirect(n+1, t.ofport)}); err != nil {
		return true, fmt.Errorf("standing redirects: %w", err)
	}
	return true, nil
}

// delReceivers removes both receive ports in one transaction.
func (b *Backend) delReceivers(ctx context.Context) error {
	return b.cfg.OVS.ChangePorts(ctx, ovs.PortsChange{Bridge: b.cfg.Bridge, Del: []string{RxName(b.cfg.Interface), rxOld(b.cfg.Interface)}})
}

// dstPort is i's options:dst_port as the agent's port type.
func dstPort(i ovs.Interface) (tunnelport.Port, error) {
	p, err := i.DstPort()
	return tunnelport.Port(p), err
}
