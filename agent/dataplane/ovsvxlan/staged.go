package ovsvxlan

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
)

// The staged strategy on an OVS bridge (docs/staged.md; measured on the
// lab's userspace datapath, OVS 3.1):
//
//   - Listen: the new port opened in the firewall; a receive port added
//     (RxName: a VXLAN interface with vxlan0's options but dst_port, and
//     bound to the node's underlay IP, options:local_ip); a redirect flow
//     per receive port (this one and the one the switch adds), table 0 at
//     the top priority, in_port=<receive port>: load vxlan0's ofport into
//     in_port and resubmit to table 0, so what arrives on a receive port
//     is handled as what arrives on vxlan0 by the owner's own flows (the
//     ones it adds later too), tagged CookieIn; one add-flows run.
//   - SwitchSend: one OVSDB transaction adds a second receive port on the
//     old port (rxOld, bound like the first) and moves vxlan0, which the
//     owner's flows output to, onto the new port. Bound to the node IP,
//     each receive port is a more specific tunnel than vxlan0, so vxlan0
//     joins or leaves a receive port's UDP port with both registered. No
//     flow changes: Listen added the redirects of both receive ports, whose
//     OpenFlow port numbers it requested (ofport_request) from the top of
//     the range. UnswitchSend is the reverse transaction. Swapping the two
//     tunnels' dst_port instead leaves OVS's userspace tunnel registry
//     listening on the old port twice and on the new one not at all
//     (measured: tnl/ports/show; docs/staged.md).
//   - Retire: both receive ports go in one transaction (every node sends
//     the new port by then), then their flows. vxlan0 is on the new port.
//
// A node's staged change is two OpenFlow table changes (the redirects
// added and deleted); with copies of vxlan0's flows it was four or more
// (input copies, send copies one priority higher, each removed per table,
// and the owner's flows added meanwhile had no copy). That
// matters on a userspace datapath, where a flow table change stalls the
// node's forwarding for up to half a second at N = 32 on the lab while a
// port change does not (docs/staged.md, "What costs on OVS at N = 32").
// Before the receive port was bound, vxlan0 on its port was a duplicate
// OVS does not register (nothing received until OVS revisits it: seconds,
// notes/ovs-second-tunnel.md).
//
// With Config.StandingRedirects (the agent's --ovs-standing-redirects) the
// two redirects stay between operations: Keep installs them when the agent
// starts (and repairs them every minute), the listen's receive ports take
// their numbers, and the retirement and the undo leave them. A node's
// staged change is then no flow table change at all, port changes only.
// Between operations they are dormant: they match OpenFlow port numbers
// no interface has (Keep moves them should one take a number).

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

var (
	_ dataplane.StagedAdvisor = (*Backend)(nil)
	_ dataplane.Keeper        = (*Backend)(nil)
)

// StagedProblems implements dataplane.Stager.
func (b *Backend) StagedProblems(ctx context.Context, to uint16) []string {
	var out []string
	switch {
	case b.cfg.SDN:
		out = append(out, "the openshift-sdn profile does not support the staged strategy: the SDN owns br0's flows and re-installs them (docs/openshift-sdn.md); use --strategy atomic")
	case b.cfg.OF == nil || b.cfg.Vsctl == nil:
		out = append(out, "this agent was built without OpenFlow access to the bridge: the staged strategy needs it; use --strategy atomic")
		return out
	}
	iface, err := b.getInterface(ctx)
	if err != nil {
		return append(out, err.Error())
	}
	if !b.cfg.RxLocalIP.Is4() {
		out = append(out, "no underlay address: the staged strategy binds its receive port to the node IP the tunnel uses; set the agent's --underlay-address (or --listen to the node IP) or use --strategy atomic")
	}
	if v := iface.Options["local_ip"]; v != "" {
		out = append(out, fmt.Sprintf("interface %s has local_ip=%q: the staged receive port could not be a more specific tunnel than it (docs/staged.md); use --strategy atomic", b.cfg.Interface, v))
	}
	if iface.Options["remote_ip"] != "flow" {
		out = append(out, fmt.Sprintf("interface %s has remote_ip=%q: the staged strategy copies flows that set tun_dst (remote_ip=flow, as OpenShift SDN's vxlan0)", b.cfg.Interface, iface.Options["remote_ip"]))
	}
	rx, rxErr := b.cfg.OVS.GetInterface(ctx, RxName(b.cfg.Interface))
	if rxErr == nil && rx.Options["dst_port"] != strconv.Itoa(int(to)) {
		out = append(out, fmt.Sprintf("an interface %s exists already (dst_port %s), not one this operation made: remove it first", RxName(b.cfg.Interface), rx.Options["dst_port"]))
	}
	if _, err := b.cfg.OVS.GetInterface(ctx, rxOld(b.cfg.Interface)); err == nil && ovs.IsNotFound(rxErr) {
		// A switched node has both; the old port's receiver alone is not
		// ours.
		out = append(out, fmt.Sprintf("an interface %s exists already, not one this operation made (no %s beside it): remove it first", rxOld(b.cfg.Interface), RxName(b.cfg.Interface)))
	}
	if b.cfg.Vsctl != nil {
		// An internal port without mtu_request gets its MTU recomputed
		// when a port joins or leaves the bridge (measured on the lab's
		// br0: 1450 -> 1500 when the receive port was added).
		o, err := b.cfg.Vsctl(ctx, "--format=csv", "--no-headings", "--columns=name,mtu_request", "find", "interface", "type=internal")
		if err != nil {
			out = append(out, fmt.Sprintf("internal interfaces: %v", err))
		}
		for _, line := range strings.Split(strings.TrimSpace(string(o)), "\n") {
			name, req, _ := strings.Cut(line, ",")
			name = strings.Trim(name, `"`)
			if name != "" && (req == "[]" || req == "") && b.onBridge(ctx, name) {
				out = append(out, fmt.Sprintf("internal interface %s of %s has no mtu_request: adding the staged receive port would make OVS recompute its MTU; pin it first (ovs-vsctl set interface %s mtu_request=<its MTU>, as OpenShift SDN does for tun0) or use --strategy atomic", name, b.cfg.Bridge, name))
			}
		}
	}
	flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
	if err != nil {
		return append(out, fmt.Sprintf("flows of %s: %v", b.cfg.Bridge, err))
	}
	for _, f := range flows {
		if f.Table == 0 && f.Priority == redirectPriority && f.Cookie != CookieIn {
			out = append(out, fmt.Sprintf("flow %s: table 0's top priority is taken, where the staged strategy puts its redirect of the receive port; use --strategy atomic", f))
		}
	}
	return out
}

// onBridge reports whether interface name's port is on the managed bridge.
func (b *Backend) onBridge(ctx context.Context, name string) bool {
	if name == b.cfg.Bridge {
		return true // the bridge's own port, which port-to-br does not list
	}
	o, err := b.cfg.Vsctl(ctx, "port-to-br", name)
	return err == nil && strings.TrimSpace(string(o)) == b.cfg.Bridge
}

// StagedLosesLess implements dataplane.StagedAdvisor.
func (b *Backend) StagedLosesLess() (bool, string) {
	switch {
	case b.cfg.SDN:
		return false, "openshift-sdn: the profile refuses the staged strategy"
	case b.cfg.StandingRedirects:
		return true, "OVS with standing redirects: a staged change makes no flow table change, and lost nothing in the lab at N = 32 where atomic lost (docs/staged.md, Figures)"
	}
	return false, "OVS without --ovs-standing-redirects: a staged change makes two flow table changes, which stall a userspace datapath: it lost more than atomic in the lab at N = 32 (docs/staged.md, Figures)"
}

// StagedActions implements dataplane.Stager.
func (b *Backend) StagedActions(from, to uint16) []string {
	open, closeOld := b.cfg.Firewall.Actions(from, to)
	out := append([]string{}, open...)
	rx := RxName(b.cfg.Interface)
	listenFlows, retireFlows := "and two flows", "then their flows"
	if b.cfg.StandingRedirects {
		listenFlows, retireFlows = "at the OpenFlow numbers of the two standing flows", "their standing flows stay, dormant (--ovs-standing-redirects)"
	}
	out = append(out,
		fmt.Sprintf("listen: add %s to %s (vxlan, %s's options, dst_port %d, local_ip %s) %s handling the receive ports' input as %s's (table 0, priority %d, cookie %#x)", rx, b.cfg.Bridge, b.cfg.Interface, to, b.cfg.RxLocalIP, listenFlows, b.cfg.Interface, redirectPriority, CookieIn),
		fmt.Sprintf("switch: in one transaction add %s (dst_port %d, local_ip %s) and set %s dst_port %d -> %d; back: the reverse, in one transaction", rxOld(b.cfg.Interface), from, b.cfg.RxLocalIP, b.cfg.Interface, from, to),
		fmt.Sprintf("retire: delete %s and %s, %s (%s stays on %d)", rx, rxOld(b.cfg.Interface), retireFlows, b.cfg.Interface, to))
	return append(out, closeOld...)
}

func (b *Backend) stagedReady() error {
	if b.cfg.OF == nil || b.cfg.Vsctl == nil {
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
	tunnel, rx, old       uint16
	ofport, rxOFP, oldOFP int64
}

// readTunnels reads vxlan0 and both receive ports.
func (b *Backend) readTunnels(ctx context.Context) (tunnels, error) {
	iface, err := b.getInterface(ctx)
	if err != nil {
		return tunnels{}, err
	}
	t := tunnels{ofport: iface.OFPort}
	if t.tunnel, err = iface.DstPort(); err != nil {
		return t, err
	}
	for _, r := range []struct {
		name string
		port *uint16
		ofp  *int64
	}{{RxName(b.cfg.Interface), &t.rx, &t.rxOFP}, {rxOld(b.cfg.Interface), &t.old, &t.oldOFP}} {
		i, err := b.cfg.OVS.GetInterface(ctx, r.name)
		switch {
		case ovs.IsNotFound(err):
			continue
		case err != nil:
			return t, fmt.Errorf("receive port %s: %w", r.name, err)
		}
		if *r.port, err = i.DstPort(); err != nil {
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
	on := func(p uint16) string {
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

// usedOFPorts is every OpenFlow port number an interface has or requests.
func (b *Backend) usedOFPorts(ctx context.Context) (map[int64]bool, error) {
	o, err := b.cfg.Vsctl(ctx, "--bare", "--columns=ofport,ofport_request", "list", "interface")
	if err != nil {
		return nil, fmt.Errorf("ofports: %w", err)
	}
	used := map[int64]bool{}
	for _, f := range strings.Fields(string(o)) {
		if n, err := strconv.ParseInt(f, 10, 64); err == nil {
			used[n] = true
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

// addRx is ovs-vsctl's arguments adding a receive port: vxlan0's options
// but dst_port, bound to the node IP, at OpenFlow port ofport.
func (b *Backend) addRx(sd snapshot, name string, port uint16, ofport int64) []string {
	args := []string{"--may-exist", "add-port", b.cfg.Bridge, name, "--", "set", "interface", name, "type=vxlan",
		fmt.Sprintf("ofport_request=%d", ofport)}
	for _, k := range slices.Sorted(maps.Keys(sd.Options)) {
		if k != "dst_port" && k != "local_ip" {
			args = append(args, fmt.Sprintf("options:%s=%s", k, sd.Options[k]))
		}
	}
	return append(args, fmt.Sprintf("options:dst_port=%d", port), "options:local_ip="+b.cfg.RxLocalIP.String())
}

// Listen implements dataplane.Stager. It also serves a node that restarts
// listening, switched or not (after a reboot the flows are gone while the
// ports stay in OVSDB): every receive port the node's state needs is
// there, and both redirects.
func (b *Backend) Listen(ctx context.Context, s dataplane.Snapshot) error {
	sd, err := decode(s)
	if err != nil {
		return err
	}
	if err := b.stagedReady(); err != nil {
		return err
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	if !b.cfg.RxLocalIP.Is4() {
		return fmt.Errorf("listen: no underlay address to bind %s to", RxName(b.cfg.Interface))
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Open(s.ToPort); err != nil {
			return err
		}
	}
	t, err := b.readTunnels(ctx)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	switch {
	case t.tunnel != s.FromPort && t.tunnel != s.ToPort:
		return fmt.Errorf("listen: %s is on port %d, neither %d nor %d: something else moved it; not listening", b.cfg.Interface, t.tunnel, s.FromPort, s.ToPort)
	case t.rx != 0 && t.rx != s.ToPort, t.old != 0 && t.old != s.FromPort:
		return fmt.Errorf("listen: %s: not what this operation makes; not listening", b.where(t))
	}
	// Our redirects, read once: adding the receive ports below changes no
	// flow (a second dump costs as much as a flow change's call on a busy
	// userspace datapath).
	ofport := t.ofport
	have, others, err := b.redirected(ctx, ofport)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var args []string
	n := t.rxOFP
	if t.rx == 0 {
		if n, err = b.rxNumbers(ctx, have); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		args = b.addRx(sd, RxName(b.cfg.Interface), s.ToPort, n)
	}
	if t.tunnel == s.ToPort && t.old == 0 {
		// vxlan0 on the new port and nothing on the old one: a node whose
		// retirement was cut short. Receiving the old port again is
		// harmless, and the retirement removes it again.
		if len(args) > 0 {
			args = append(args, "--")
		}
		args = append(args, b.addRx(sd, rxOld(b.cfg.Interface), s.FromPort, n+1)...)
	}
	if len(args) > 0 {
		if _, err := b.cfg.Vsctl(ctx, args...); err != nil {
			return fmt.Errorf("listen: add %s: %w", RxName(b.cfg.Interface), err)
		}
		if t, err = b.readTunnels(ctx); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		if t.rx != s.ToPort {
			return fmt.Errorf("listen: added %s, read back %s", RxName(b.cfg.Interface), b.where(t))
		}
	}
	if t.ofport != ofport { // vxlan0 recreated meanwhile
		if have, others, err = b.redirected(ctx, t.ofport); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	// The redirects wanted: both receive ports' numbers (the old port's
	// one reserved until the switch adds it). Any other flow of ours is
	// stale, and a redirect for a number some other port may get one day
	// would take that port's frames: all of ours go, and the wanted ones
	// come back.
	want := map[int64]bool{t.rxOFP: true, t.rxOFP + 1: true}
	if t.old != 0 {
		want[t.oldOFP] = true
	}
	for p := range have {
		others = others || !want[p]
	}
	if others {
		if err := b.delOurs(ctx, CookieIn, CookieOut); err != nil {
			return fmt.Errorf("listen: stale flows: %w", err)
		}
		have = nil
	}
	var add []openflow.Flow
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if !have[p] {
			add = append(add, redirect(p, t.ofport))
		}
	}
	if len(add) > 0 {
		if err := b.cfg.OF.AddFlows(ctx, b.cfg.Bridge, add); err != nil {
			return fmt.Errorf("listen: the receive ports' flows: %w", err)
		}
	}
	return nil
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

// dropReceivers removes both receive ports in one transaction, then every
// flow of ours (an earlier layout's copies too): the end of a retirement and
// of an undone listen alike. With standing redirects their two flows stay
// (keep removes only what is not them).
func (b *Backend) dropReceivers(ctx context.Context) error {
	if _, err := b.cfg.Vsctl(ctx, "--if-exists", "del-port", b.cfg.Bridge, RxName(b.cfg.Interface),
		"--", "--if-exists", "del-port", b.cfg.Bridge, rxOld(b.cfg.Interface)); err != nil {
		return err
	}
	if b.cfg.StandingRedirects {
		_, err := b.keep(ctx)
		return err
	}
	return b.delOurs(ctx, CookieIn, CookieOut)
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

// unswitch moves vxlan0 back onto the old port and removes the old port's
// receiver, in one transaction: vxlan0 joins it there (bound to the node
// IP, the receiver is the more specific tunnel: both registered) and takes
// over as it goes.
func (b *Backend) unswitch(ctx context.Context, s dataplane.Snapshot) error {
	_, err := b.cfg.Vsctl(ctx, "set", "interface", b.cfg.Interface, fmt.Sprintf("options:dst_port=%d", s.FromPort),
		"--", "--if-exists", "del-port", b.cfg.Bridge, rxOld(b.cfg.Interface))
	return err
}

// Unlisten implements dataplane.Stager: the receive ports and their flows
// go. A node still sending the new port is switched back first (the full
// rollback after a send-only one finds it unswitched already).
func (b *Backend) Unlisten(ctx context.Context, s dataplane.Snapshot) error {
	sd, err := decode(s)
	if err != nil {
		return err
	}
	if err := b.stagedReady(); err != nil {
		return err
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	t, err := b.readTunnels(ctx)
	if err != nil {
		return fmt.Errorf("unlisten: %w", err)
	}
	switch t.tunnel {
	case s.FromPort:
	case s.ToPort:
		if t.old == 0 {
			return fmt.Errorf("unlisten: %s: nothing receives port %d to switch back onto; not touching them", b.where(t), s.FromPort)
		}
		if err := b.unswitch(ctx, s); err != nil {
			return fmt.Errorf("unlisten: switch sending back: %w", err)
		}
	default:
		return fmt.Errorf("unlisten: %s: not this operation's; not touching them", b.where(t))
	}
	if err := b.dropReceivers(ctx); err != nil {
		return fmt.Errorf("unlisten: %w", err)
	}
	if b.cfg.Firewall == nil {
		return nil
	}
	return b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent)
}

// sendState is the interface's state with Port the port the node sends on.
func (b *Backend) sendState(ctx context.Context, port uint16, t0, t1 time.Time) (dataplane.State, error) {
	st, err := b.Read(ctx)
	if err != nil {
		return st, err
	}
	if st.Port != port {
		return st, fmt.Errorf("read back: %s sends on port %d, want %d", b.cfg.Interface, st.Port, port)
	}
	st.Detail["send_port"] = strconv.Itoa(int(port))
	st.Written, st.Effective = t0, t1
	return st, nil
}

// SwitchSend implements dataplane.Stager: one transaction adds the old
// port's receiver and moves vxlan0, which the owner's flows output to,
// onto the new port (where the listen's receiver is).
func (b *Backend) SwitchSend(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	sd, err := decode(s)
	if err != nil {
		return dataplane.State{}, err
	}
	if err := b.stagedReady(); err != nil {
		return dataplane.State{}, err
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	t, err := b.readTunnels(ctx)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("switch sending: %w", err)
	}
	t0 := time.Now()
	switch {
	case t.tunnel == s.ToPort && t.old == s.FromPort: // a replay
	case t.tunnel == s.FromPort && t.rx == s.ToPort:
		// The old port's receiver takes what the unswitched nodes send:
		// its flow must be there before it is.
		have, _, err := b.redirected(ctx, t.ofport)
		if err != nil {
			return dataplane.State{}, fmt.Errorf("switch sending: %w", err)
		}
		if !have[t.rxOFP] || !have[t.rxOFP+1] {
			return dataplane.State{}, fmt.Errorf("switch sending: the receive ports' flows are missing (listen first)")
		}
		// Should OVS give the receiver another number, its frames would
		// miss the redirect: refuse while vxlan0 has not moved.
		used, err := b.usedOFPorts(ctx)
		if err != nil {
			return dataplane.State{}, fmt.Errorf("switch sending: %w", err)
		}
		if used[t.rxOFP+1] {
			return dataplane.State{}, fmt.Errorf("switch sending: OpenFlow port %d, which %s needs (its flow is in place), is taken by another interface: not switching; roll back and run the operation again", t.rxOFP+1, rxOld(b.cfg.Interface))
		}
		args := append(b.addRx(sd, rxOld(b.cfg.Interface), s.FromPort, t.rxOFP+1),
			"--", "set", "interface", b.cfg.Interface, fmt.Sprintf("options:dst_port=%d", s.ToPort))
		t0 = time.Now()
		if _, err := b.cfg.Vsctl(ctx, args...); err != nil {
			return dataplane.State{}, fmt.Errorf("switch sending: %w", err)
		}
	default:
		return dataplane.State{}, fmt.Errorf("switch sending: %s, want %s on %d and %s on %d (listen first)", b.where(t), b.cfg.Interface, s.FromPort, RxName(b.cfg.Interface), s.ToPort)
	}
	return b.sendState(ctx, s.ToPort, t0, time.Now())
}

// UnswitchSend implements dataplane.Stager.
func (b *Backend) UnswitchSend(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	if _, err := decode(s); err != nil {
		return dataplane.State{}, err
	}
	if err := b.stagedReady(); err != nil {
		return dataplane.State{}, err
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	t, err := b.readTunnels(ctx)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("switch sending back: %w", err)
	}
	t0 := time.Now()
	switch {
	case t.tunnel == s.FromPort: // not switched
	case t.tunnel == s.ToPort && t.old == s.FromPort:
		if err := b.unswitch(ctx, s); err != nil {
			return dataplane.State{}, fmt.Errorf("switch sending back: %w", err)
		}
	default:
		return dataplane.State{}, fmt.Errorf("switch sending back: %s: not this operation's; not touching them", b.where(t))
	}
	return b.sendState(ctx, s.FromPort, t0, time.Now())
}

// Retire implements dataplane.Stager: every node sends the new port, so
// both receive ports go in one transaction (vxlan0 on the new port stays),
// then their flows.
func (b *Backend) Retire(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	if _, err := decode(s); err != nil {
		return dataplane.State{}, err
	}
	if err := b.stagedReady(); err != nil {
		return dataplane.State{}, err
	}
	b.staged.Lock()
	defer b.staged.Unlock()
	t, err := b.readTunnels(ctx)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("retire: %w", err)
	}
	switch {
	case t.tunnel == s.ToPort: // switched; or a replay
	case t.tunnel == s.FromPort && t.rx == s.ToPort:
		// Not switched (an earlier layout's node, whose flow copies sent
		// the new port): vxlan0 joins the receiver on the new port first.
		// Bound to the node IP, the receiver is more specific, so both
		// stay registered, and it keeps receiving until it goes.
		if _, err := b.cfg.Vsctl(ctx, "set", "interface", b.cfg.Interface, fmt.Sprintf("options:dst_port=%d", s.ToPort)); err != nil {
			return dataplane.State{}, fmt.Errorf("retire: move %s to %d: %w", b.cfg.Interface, s.ToPort, err)
		}
	default:
		return dataplane.State{}, fmt.Errorf("retire: %s: not this operation's; not touching them", b.where(t))
	}
	if err := b.dropReceivers(ctx); err != nil {
		return dataplane.State{}, fmt.Errorf("retire: %w", err)
	}
	st, err := b.Read(ctx)
	if err != nil {
		return st, err
	}
	if st.Port != s.ToPort {
		return st, fmt.Errorf("retire: read back port %d, want %d", st.Port, s.ToPort)
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Close(s.FromPort, nil); err != nil {
			return st, err
		}
	}
	return st, nil
}
