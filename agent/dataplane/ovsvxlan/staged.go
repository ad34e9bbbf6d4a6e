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
)

// The staged strategy on an OVS bridge (docs/staged.md; measured on the
// lab's userspace datapath, OVS 3.1, probes every 1 ms, 8 nodes):
//
//   - Listen: the new port opened in the firewall; a receive port added
//     (RxName: a VXLAN interface with vxlan0's options but dst_port, and
//     bound to the node's underlay IP, options:local_ip); every flow
//     matching in_port=vxlan0 copied with in_port=<receive port>, tagged
//     CookieIn. Lost: 0.
//   - SwitchSend: every flow that outputs to vxlan0 copied one priority
//     higher, same match, output to the receive port instead, tagged
//     CookieOut (the owner's flows are never touched). Lost: 0.
//     UnswitchSend deletes the CookieOut copies.
//   - Retire, each step lossless on its own: vxlan0 moves to the new port
//     while the receive port is still there (bound to the node IP, the
//     receive port is a more specific tunnel than vxlan0, so OVS
//     registers both and the receive port keeps what arrives); the
//     CookieOut copies go (sending falls back to vxlan0, now on the new
//     port); the receive port goes (receiving falls back to vxlan0); the
//     CookieIn copies go. Lost: 0 in 24 retirements, one node at a time.
//     Before the receive port was bound, vxlan0 on its port was a
//     duplicate OVS does not register (nothing received until OVS
//     revisits it: seconds, notes/ovs-second-tunnel.md), so the move and
//     the port's removal had to be one transaction, with the copies
//     sending on both ports first: that lost 4-9 ms on 4 of 16
//     retirements.

// Cookies of the flows the staged strategy adds (no owner's flow uses them).
const (
	CookieIn  uint64 = 0x0c07c07c07000001
	CookieOut uint64 = 0x0c07c07c07000002
)

// RxName is the receive port's interface name for iface.
func RxName(iface string) string { return iface + "-cot" }

var _ dataplane.Stager = (*Backend)(nil)

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
	if rx, err := b.cfg.OVS.GetInterface(ctx, RxName(b.cfg.Interface)); err == nil && rx.Options["dst_port"] != strconv.Itoa(int(to)) {
		out = append(out, fmt.Sprintf("an interface %s exists already (dst_port %s), not one this operation made: remove it first", RxName(b.cfg.Interface), rx.Options["dst_port"]))
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
	port := strconv.FormatInt(iface.OFPort, 10)
	taken := map[string]bool{}
	for _, f := range flows {
		if f.Cookie != CookieOut {
			taken[slotKey(f.Table, f.Priority, f)] = true
		}
	}
	for _, f := range flows {
		if f.Cookie == CookieIn || f.Cookie == CookieOut || !outputsTo(f.Actions, port) {
			continue
		}
		if taken[slotKey(f.Table, f.Priority+1, f)] {
			out = append(out, fmt.Sprintf("flow %s: the slot one priority above it is taken, where the staged strategy puts its copy", f))
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

// slotKey is a flow's table, priority and match.
func slotKey(table uint8, prio uint16, f openflow.Flow) string {
	return fmt.Sprintf("%d/%d/%s", table, prio, f.Normalize().MatchString())
}

// StagedActions implements dataplane.Stager.
func (b *Backend) StagedActions(from, to uint16) []string {
	open, closeOld := b.cfg.Firewall.Actions(from, to)
	out := append([]string{}, open...)
	rx := RxName(b.cfg.Interface)
	out = append(out,
		fmt.Sprintf("listen: add %s to %s (vxlan, %s's options, dst_port %d, local_ip %s) and copy every in_port=%s flow for it (cookie %#x)", rx, b.cfg.Bridge, b.cfg.Interface, to, b.cfg.RxLocalIP, b.cfg.Interface, CookieIn),
		fmt.Sprintf("switch: copy every flow that outputs to %s one priority higher, output to %s (cookie %#x); back: delete the copies", b.cfg.Interface, rx, CookieOut),
		fmt.Sprintf("retire: set %s dst_port %d -> %d (%s still receives), delete the send copies, delete %s, delete the input copies", b.cfg.Interface, from, to, rx, rx))
	return append(out, closeOld...)
}

// outputsTo reports whether actions output to port (a number).
func outputsTo(actions, port string) bool {
	return slices.Contains(splitActions(actions), "output:"+port)
}

// splitActions splits an action list at its top-level commas.
func splitActions(a string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range a {
		switch c {
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, a[start:i])
				start = i + 1
			}
		}
	}
	return append(out, a[start:])
}

// replaceOutput rewrites output:from as with (one or more actions).
func replaceOutput(actions, from, with string) string {
	parts := splitActions(actions)
	for i, p := range parts {
		if p == "output:"+from {
			parts[i] = with
		}
	}
	return strings.Join(parts, ",")
}

func (b *Backend) stagedReady() error {
	if b.cfg.OF == nil || b.cfg.Vsctl == nil {
		return fmt.Errorf("staged strategy: no OpenFlow access configured")
	}
	return nil
}

// rxPort reads the receive port's ofport (0 when it does not exist).
func (b *Backend) rxPort(ctx context.Context) (int64, error) {
	rx, err := b.cfg.OVS.GetInterface(ctx, RxName(b.cfg.Interface))
	if err != nil {
		return 0, nil //nolint:nilerr // missing: none
	}
	if rx.OFPort <= 0 {
		return 0, fmt.Errorf("receive port %s has ofport %d (error %q)", rx.Name, rx.OFPort, rx.Error)
	}
	return rx.OFPort, nil
}

// needRx is rxPort where the receive port must exist.
func (b *Backend) needRx(ctx context.Context, what string) (int64, error) {
	p, err := b.rxPort(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if p == 0 {
		return 0, fmt.Errorf("%s: no receive port %s (listen first)", what, RxName(b.cfg.Interface))
	}
	return p, nil
}

// Listen implements dataplane.Stager.
func (b *Backend) Listen(ctx context.Context, s dataplane.Snapshot) error {
	sd, err := decode(s)
	if err != nil {
		return err
	}
	if err := b.stagedReady(); err != nil {
		return err
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Open(s.ToPort); err != nil {
			return err
		}
	}
	iface, err := b.getInterface(ctx)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if got := iface.Options["dst_port"]; got != strconv.Itoa(int(s.FromPort)) && (got != "" || s.FromPort != 4789) {
		return fmt.Errorf("listen: %s is on port %s, not %d: something else moved it; not listening", b.cfg.Interface, got, s.FromPort)
	}
	rx := RxName(b.cfg.Interface)
	if _, err := b.cfg.OVS.GetInterface(ctx, rx); err != nil {
		args := []string{"--may-exist", "add-port", b.cfg.Bridge, rx, "--", "set", "interface", rx, "type=vxlan"}
		for _, k := range slices.Sorted(maps.Keys(sd.Options)) {
			v := sd.Options[k]
			if k == "dst_port" {
				continue
			}
			args = append(args, fmt.Sprintf("options:%s=%s", k, v))
		}
		if !b.cfg.RxLocalIP.Is4() {
			return fmt.Errorf("listen: no underlay address to bind %s to", rx)
		}
		args = append(args, fmt.Sprintf("options:dst_port=%d", s.ToPort), "options:local_ip="+b.cfg.RxLocalIP.String())
		if _, err := b.cfg.Vsctl(ctx, args...); err != nil {
			return fmt.Errorf("listen: add %s: %w", rx, err)
		}
	}
	rxp, err := b.needRx(ctx, "listen")
	if err != nil {
		return err
	}
	flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	in := strconv.FormatInt(iface.OFPort, 10)
	var copies []openflow.Flow
	for _, f := range flows {
		if f.Cookie == CookieIn || f.Cookie == CookieOut {
			continue
		}
		idx := slices.IndexFunc(f.Match, func(m openflow.Field) bool { return m.Key == "in_port" && m.Value == in })
		if idx < 0 {
			continue
		}
		c := f
		c.Cookie = CookieIn
		c.Match = slices.Clone(f.Match)
		c.Match[idx].Value = strconv.FormatInt(rxp, 10)
		copies = append(copies, c)
	}
	if err := b.cfg.OF.AddFlows(ctx, b.cfg.Bridge, copies); err != nil {
		return fmt.Errorf("listen: copy the in_port flows: %w", err)
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

// Unlisten implements dataplane.Stager.
func (b *Backend) Unlisten(ctx context.Context, s dataplane.Snapshot) error {
	sd, err := decode(s)
	if err != nil {
		return err
	}
	if err := b.stagedReady(); err != nil {
		return err
	}
	if err := b.delOurs(ctx, CookieOut, CookieIn); err != nil {
		return fmt.Errorf("unlisten: %w", err)
	}
	if _, err := b.cfg.Vsctl(ctx, "--if-exists", "del-port", b.cfg.Bridge, RxName(b.cfg.Interface)); err != nil {
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
	st.Port = port
	st.Detail["send_port"] = strconv.Itoa(int(port))
	st.Written, st.Effective = t0, t1
	return st, nil
}

// SwitchSend implements dataplane.Stager.
func (b *Backend) SwitchSend(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	if _, err := decode(s); err != nil {
		return dataplane.State{}, err
	}
	if err := b.stagedReady(); err != nil {
		return dataplane.State{}, err
	}
	iface, err := b.getInterface(ctx)
	if err != nil {
		return dataplane.State{}, err
	}
	rxp, err := b.needRx(ctx, "switch sending")
	if err != nil {
		return dataplane.State{}, err
	}
	flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
	if err != nil {
		return dataplane.State{}, err
	}
	port := strconv.FormatInt(iface.OFPort, 10)
	t0 := time.Now()
	var copies []openflow.Flow
	for _, f := range flows {
		if f.Cookie == CookieIn || f.Cookie == CookieOut || !outputsTo(f.Actions, port) {
			continue
		}
		c := f
		c.Cookie, c.Priority = CookieOut, f.Priority+1
		c.Actions = replaceOutput(f.Actions, port, "output:"+strconv.FormatInt(rxp, 10))
		copies = append(copies, c)
	}
	// One request for all of them (on a userspace datapath the node's CPU
	// carries the traffic too: a run per flow starved it in the lab).
	if err := b.cfg.OF.AddFlows(ctx, b.cfg.Bridge, copies); err != nil {
		return dataplane.State{}, fmt.Errorf("switch sending: %w", err)
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
	t0 := time.Now()
	if err := b.delOurs(ctx, CookieOut); err != nil {
		return dataplane.State{}, fmt.Errorf("switch sending back: %w", err)
	}
	return b.sendState(ctx, s.FromPort, t0, time.Now())
}

// Retire implements dataplane.Stager.
func (b *Backend) Retire(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	if _, err := decode(s); err != nil {
		return dataplane.State{}, err
	}
	if err := b.stagedReady(); err != nil {
		return dataplane.State{}, err
	}
	iface, err := b.getInterface(ctx)
	if err != nil {
		return dataplane.State{}, err
	}
	rx := RxName(b.cfg.Interface)
	cur := iface.Options["dst_port"]
	switch cur {
	case strconv.Itoa(int(s.ToPort)): // a replay: retired already
	case strconv.Itoa(int(s.FromPort)):
		if _, err := b.needRx(ctx, "retire"); err != nil {
			return dataplane.State{}, err
		}
		// Make before break: the receive port, bound to the node IP, is
		// more specific than vxlan0 and keeps receiving while vxlan0
		// joins it on the new port; then each fallback below lands on
		// vxlan0 already listening and sending there.
		if _, err := b.cfg.Vsctl(ctx, "set", "interface", b.cfg.Interface, fmt.Sprintf("options:dst_port=%d", s.ToPort)); err != nil {
			return dataplane.State{}, fmt.Errorf("retire: move %s to %d: %w", b.cfg.Interface, s.ToPort, err)
		}
	default:
		return dataplane.State{}, fmt.Errorf("retire: %s is on port %s, neither %d nor %d: something else moved it; not touching it", b.cfg.Interface, cur, s.FromPort, s.ToPort)
	}
	// Sending falls back to vxlan0, then receiving: each step is a replay
	// no-op once done.
	if err := b.delOurs(ctx, CookieOut); err != nil {
		return dataplane.State{}, fmt.Errorf("retire: %w", err)
	}
	if _, err := b.cfg.Vsctl(ctx, "--if-exists", "del-port", b.cfg.Bridge, rx); err != nil {
		return dataplane.State{}, fmt.Errorf("retire: %w", err)
	}
	if err := b.delOurs(ctx, CookieIn); err != nil {
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
