package ovsvxlan

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
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

var (
	_ dataplane.StagedAdvisor = (*Backend)(nil)
	_ dataplane.Keeper        = (*Backend)(nil)
)

// StagedProblems implements dataplane.Stager.
func (b *Backend) StagedProblems(ctx context.Context, to tunnelport.Port) []string {
	var out []string
	switch {
	case b.cfg.SDN:
		out = append(out, "the openshift-sdn profile does not support the staged strategy: the SDN owns br0's flows and re-installs them (docs/openshift-sdn.md); use --strategy atomic")
	case b.cfg.OF == nil:
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
	// An internal port without mtu_request gets its MTU recomputed when a
	// port joins or leaves the bridge (measured on the lab's br0: 1450 ->
	// 1500 when the receive port was added).
	ifs, err := b.cfg.OVS.Interfaces(ctx, b.cfg.Bridge)
	if err != nil {
		out = append(out, fmt.Sprintf("internal interfaces: %v", err))
	}
	for _, i := range ifs {
		if i.Type == "internal" && i.MTURequest == 0 {
			out = append(out, fmt.Sprintf("internal interface %s of %s has no mtu_request: adding the staged receive port would make OVS recompute its MTU; pin it first (its Interface row's mtu_request set to its MTU, as OpenShift SDN does for tun0) or use --strategy atomic", i.Name, b.cfg.Bridge))
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

// StagedLosesLess implements dataplane.StagedAdvisor.
func (b *Backend) StagedLosesLess() (bool, string) {
	switch {
	case b.cfg.SDN:
		return false, "openshift-sdn: the profile refuses the staged strategy"
	case b.cfg.StandingRedirects:
		return true, "OVS with standing redirects: a staged change makes no flow table change, and lost nothing in the lab at N = 32 where atomic lost (docs/staged.md, Figures)"
	}
	// Its two flow table changes stall a userspace datapath whose main
	// thread is starved: only where 32 lab nodes saturate two cores (1 ms
	// probes) did staged lose more than atomic.
	return true, "OVS: a staged change lost less than a tenth of what atomic lost in the lab at N = 16 (1 ms probes), and nothing at N = 32 (10 ms) (docs/staged.md, Figures)"
}

// StagedActions implements dataplane.Stager.
func (b *Backend) StagedActions(from, to tunnelport.Port) []string {
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
	ports := ovs.PortsChange{Bridge: b.cfg.Bridge}
	n := t.rxOFP
	if t.rx == 0 {
		if n, err = b.rxNumbers(ctx, have); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		ports.Add = append(ports.Add, b.rxPort(sd, RxName(b.cfg.Interface), s.ToPort, n))
	}
	if t.tunnel == s.ToPort && t.old == 0 {
		// vxlan0 on the new port and nothing on the old one: a node whose
		// retirement was cut short. Receiving the old port again is
		// harmless, and the retirement removes it again.
		ports.Add = append(ports.Add, b.rxPort(sd, rxOld(b.cfg.Interface), s.FromPort, n+1))
	}
	if len(ports.Add) > 0 {
		if err := b.cfg.OVS.ChangePorts(ctx, ports); err != nil {
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

// dropReceivers removes both receive ports in one transaction, then every
// flow of ours (an earlier layout's copies too): the end of a retirement and
// of an undone listen alike. With standing redirects their two flows stay
// (keep removes only what is not them).
func (b *Backend) dropReceivers(ctx context.Context) error {
	if err := b.delReceivers(ctx); err != nil {
		return err
	}
	if b.cfg.StandingRedirects {
		_, err := b.keep(ctx)
		return err
	}
	return b.delOurs(ctx, CookieIn, CookieOut)
}

// unswitch moves vxlan0 back onto the old port and removes the old port's
// receiver, in one transaction: vxlan0 joins it there (bound to the node
// IP, the receiver is the more specific tunnel: both registered) and takes
// over as it goes.
func (b *Backend) unswitch(ctx context.Context, s dataplane.Snapshot) error {
	return b.cfg.OVS.ChangePorts(ctx, ovs.PortsChange{Bridge: b.cfg.Bridge,
		Move: []ovs.Move{{Name: b.cfg.Interface, From: uint16(s.ToPort), To: uint16(s.FromPort)}}, Del: []string{rxOld(b.cfg.Interface)}})
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
func (b *Backend) sendState(ctx context.Context, port tunnelport.Port, t0, t1 time.Time) (dataplane.State, error) {
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
		sw := ovs.PortsChange{Bridge: b.cfg.Bridge, Add: []ovs.Interface{b.rxPort(sd, rxOld(b.cfg.Interface), s.FromPort, t.rxOFP+1)},
			Move: []ovs.Move{{Name: b.cfg.Interface, From: uint16(s.FromPort), To: uint16(s.ToPort)}}}
		t0 = time.Now()
		if err := b.cfg.OVS.ChangePorts(ctx, sw); err != nil {
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
		if err := b.cfg.OVS.ChangePorts(ctx, ovs.PortsChange{Bridge: b.cfg.Bridge, Move: []ovs.Move{{Name: b.cfg.Interface, From: uint16(s.FromPort), To: uint16(s.ToPort)}}}); err != nil {
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
