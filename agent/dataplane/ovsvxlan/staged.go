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
// lab's userspace datapath, OVS 3.1, UDP both ways at 1 ms):
//
//   - Listen: the new port opened in the firewall; a receive port added
//     (RxName: a VXLAN interface with vxlan0's options but dst_port); every
//     flow matching in_port=vxlan0 copied with in_port=<receive port>,
//     tagged CookieIn. Lost: 0.
//   - SwitchSend: every flow that outputs to vxlan0 copied one priority
//     higher, same match, output to the receive port instead, tagged
//     CookieOut (the owner's flows are never touched). Lost: 0.
//     UnswitchSend deletes the CookieOut copies.
//   - Retire: the CookieOut copies first output to both ports (the
//     receive port and vxlan0, both on their port then); then ONE OVSDB
//     transaction deletes the receive port and moves vxlan0 to the new
//     port; then every flow of ours goes. Lost: 0. Other orders lose:
//     the same transaction without the double output first lost 36-48 ms
//     (the copies pointing at a deleted port until they are deleted);
//     moving vxlan0 in a transaction of its own makes it a duplicate of
//     the receive port, which OVS does not register as a tunnel: from
//     then on, or once the receive port goes, nothing is received or sent
//     until OVS revisits it (seconds; the 8-10 s of notes/ovs-second-
//     tunnel.md).

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
		fmt.Sprintf("listen: add %s to %s (vxlan, %s's options, dst_port %d) and copy every in_port=%s flow for it (cookie %#x)", rx, b.cfg.Bridge, b.cfg.Interface, to, b.cfg.Interface, CookieIn),
		fmt.Sprintf("switch: copy every flow that outputs to %s one priority higher, output to %s (cookie %#x); back: delete the copies", b.cfg.Interface, rx, CookieOut),
		fmt.Sprintf("retire: the copies output to both ports, then one OVSDB transaction deletes %s and sets %s dst_port %d -> %d, then our flows go", rx, b.cfg.Interface, from, to))
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
		args = append(args, fmt.Sprintf("options:dst_port=%d", s.ToPort))
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
		rxp, err := b.needRx(ctx, "retire")
		if err != nil {
			return dataplane.State{}, err
		}
		// Make before break, per packet: the copies send on both ports
		// while the transaction moves vxlan0 and deletes the receive port.
		flows, err := b.cfg.OF.DumpFlows(ctx, b.cfg.Bridge)
		if err != nil {
			return dataplane.State{}, err
		}
		rxs, port := strconv.FormatInt(rxp, 10), strconv.FormatInt(iface.OFPort, 10)
		var dual []openflow.Flow
		for _, f := range flows {
			if f.Cookie != CookieOut || !outputsTo(f.Actions, rxs) || outputsTo(f.Actions, port) {
				continue
			}
			f.Actions = replaceOutput(f.Actions, rxs, "output:"+rxs+",output:"+port)
			dual = append(dual, f)
		}
		if err := b.cfg.OF.AddFlows(ctx, b.cfg.Bridge, dual); err != nil {
			return dataplane.State{}, fmt.Errorf("retire: %w", err)
		}
		if _, err := b.cfg.Vsctl(ctx, "--if-exists", "del-port", b.cfg.Bridge, rx, "--",
			"set", "interface", b.cfg.Interface, fmt.Sprintf("options:dst_port=%d", s.ToPort)); err != nil {
			return dataplane.State{}, fmt.Errorf("retire: move %s to %d: %w", b.cfg.Interface, s.ToPort, err)
		}
	default:
		return dataplane.State{}, fmt.Errorf("retire: %s is on port %s, neither %d nor %d: something else moved it; not touching it", b.cfg.Interface, cur, s.FromPort, s.ToPort)
	}
	if err := b.delOurs(ctx, CookieOut, CookieIn); err != nil {
		return dataplane.State{}, fmt.Errorf("retire: %w", err)
	}
	if _, err := b.cfg.Vsctl(ctx, "--if-exists", "del-port", b.cfg.Bridge, rx); err != nil {
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
