package kernelvxlan

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// The staged strategy on a kernel VXLAN device (docs/staged.md, docs/
// kernel-vxlan.md "Staged strategy"):
//
//   - Listen: the new port opened in the firewall, then a receiver on it
//     (pkg/vxlan Listen: the device's twin under vxlan.TmpName, same VNI,
//     MAC and local address, no address, reverse-path filtering off, up).
//     The device keeps sending and receiving on the old port.
//   - SwitchSend: every FDB remote of the device gets the new port
//     (per-entry port: egress only); UnswitchSend gives them the device's
//     own port back.
//   - Retire: the receiver becomes the device (pkg/vxlan Recreate adopts it
//     while it receives: addresses added, renamed, routes moved), the
//     device's own rp_filter is put back on it, the old device is deleted,
//     the old port closed and its conntrack entries deleted.
//
// Measured at 1 ms both ways between two namespaces (pkg/vxlan
// TestStagedKernelPhases): 0 lost in every phase.

var _ dataplane.StagedAdvisor = (*Backend)(nil)

// StagedLosesLess implements dataplane.StagedAdvisor: the staged change
// lost nothing in the lab at N = 8 and 32, the atomic one loses at its
// commit instant (docs/staged.md).
func (b *Backend) StagedLosesLess() (bool, string) {
	return true, "kernel VXLAN: a staged change lost nothing in the lab at N = 8 and 32 where atomic lost (docs/staged.md, Figures)"
}

// StagedProblems implements dataplane.Stager.
func (b *Backend) StagedProblems(_ context.Context, to tunnelport.Port) []string {
	s, err := b.readDevice()
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	if s.Device.FlowBased {
		out = append(out, fmt.Sprintf("device %s is flow-based (external): the staged strategy's receiver needs a VNI of its own; use --strategy atomic", b.cfg.Device))
	}
	_, all, err := b.cfg.VXLAN.ReversePathFilter(b.cfg.Device)
	switch {
	case err != nil:
		out = append(out, fmt.Sprintf("cannot read net.ipv4.conf.all.rp_filter: %v", err))
	case all != 0:
		out = append(out, fmt.Sprintf("net.ipv4.conf.all.rp_filter is %d: the staged strategy's receiver on port %d takes packets on a device without addresses, which any reverse-path filtering drops (measured, strict and loose), and conf.all overrides the receiver's own 0; set it to 0 on every node for the change, or use --strategy atomic", all, to))
	}
	return out
}

// StagedActions implements dataplane.Stager.
func (b *Backend) StagedActions(from, to tunnelport.Port) []string {
	open, closeOld := b.cfg.Firewall.Actions(from, to)
	_, nftOpen, nftClose := b.cfg.Firewall.NFTCheck(from, to)
	out := append(append([]string{}, open...), nftOpen...)
	out = append(out,
		fmt.Sprintf("listen: add %s, a twin of %s (same VNI, MAC and local address, no address, rp_filter 0) on port %d, up: %s keeps port %d", vxlan.TmpName(b.cfg.Device), b.cfg.Device, to, b.cfg.Device, from),
		fmt.Sprintf("switch: every FDB remote of %s sends to port %d (per-entry port); back: the device's own port", b.cfg.Device, to),
		fmt.Sprintf("retire: %s becomes %s while it receives (addresses added, renamed, routes moved), %s's rp_filter put back, the old device deleted", vxlan.TmpName(b.cfg.Device), b.cfg.Device, b.cfg.Device))
	out = append(out, closeOld...)
	out = append(out, nftClose...)
	if b.cfg.Conntrack != nil {
		out = append(out, fmt.Sprintf("conntrack: delete the UDP entries whose original destination port is %d", from))
	}
	if note := cniNote(b.cfg.Device, to); note != "" {
		out = append(out, note)
	}
	return out
}

// Listen implements dataplane.Stager.
func (b *Backend) Listen(_ context.Context, s dataplane.Snapshot) error {
	sd, err := b.decode(s)
	if err != nil {
		return err
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Open(s.ToPort); err != nil {
			return err
		}
	}
	cur, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	if err != nil {
		return fmt.Errorf("listen %s: %w", b.cfg.Device, err)
	}
	if cur.Device.Port != int(s.FromPort) {
		return fmt.Errorf("listen %s: the device is on port %d, not %d: something else changed it since the snapshot; not listening", b.cfg.Device, cur.Device.Port, s.FromPort)
	}
	if diff := deviceDiff(sd.Device.Device, cur.Device); diff != "" {
		return fmt.Errorf("listen %s: the device changed since the snapshot (%s): abort and prepare again", b.cfg.Device, diff)
	}
	if err := b.cfg.VXLAN.Listen(cur, int(s.ToPort)); err != nil {
		return fmt.Errorf("listen %s on port %d: %w", b.cfg.Device, s.ToPort, err)
	}
	return nil
}

// Unlisten implements dataplane.Stager: the receiver (and any old device
// left) goes, then the target port's rules Listen added.
func (b *Backend) Unlisten(_ context.Context, s dataplane.Snapshot) error {
	sd, err := b.decode(s)
	if err != nil {
		return err
	}
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return fmt.Errorf("unlisten %s: remove the receiver: %w", b.cfg.Device, err)
	}
	if b.cfg.Firewall == nil {
		return nil
	}
	return b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent)
}

// sendOn points every FDB remote of the device at port (0: the device's
// own) and reads the device back; State.Port is the port it sends on.
func (b *Backend) sendOn(op string, s dataplane.Snapshot, port, want tunnelport.Port) (dataplane.State, error) {
	if _, err := b.decode(s); err != nil {
		return dataplane.State{}, err
	}
	cur, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("%s %s: %w", op, b.cfg.Device, err)
	}
	if cur.Device.Port != int(s.FromPort) {
		return b.state(cur), fmt.Errorf("%s %s: the device is on port %d, not %d: retired already, or something else moved it", op, b.cfg.Device, cur.Device.Port, s.FromPort)
	}
	t0 := time.Now()
	if err := b.cfg.VXLAN.SetFDBPorts(cur, int(port)); err != nil {
		return b.state(cur), fmt.Errorf("%s %s: %w", op, b.cfg.Device, err)
	}
	t1 := time.Now()
	after, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("%s %s: read back: %w", op, b.cfg.Device, err)
	}
	for _, e := range after.FDB {
		p := e.Port
		if p == 0 {
			p = after.Device.Port
		}
		if p != int(want) {
			return b.state(after), fmt.Errorf("%s %s: read back an FDB remote %s %s on port %d, want %d", op, b.cfg.Device, e.MAC, e.Dst, p, want)
		}
	}
	st := b.state(after)
	st.Port = want
	st.Detail["send_port"] = strconv.Itoa(int(want))
	st.Detail["listen_ports"] = fmt.Sprintf("%d,%d", s.FromPort, s.ToPort)
	st.Written, st.Effective = t0, t1
	return st, nil
}

// SwitchSend implements dataplane.Stager.
func (b *Backend) SwitchSend(_ context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	return b.sendOn("switch sending", s, s.ToPort, s.ToPort)
}

// UnswitchSend implements dataplane.Stager.
func (b *Backend) UnswitchSend(_ context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	return b.sendOn("switch sending back", s, 0, s.FromPort)
}

// Retire implements dataplane.Stager.
func (b *Backend) Retire(_ context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	sd, err := b.decode(s)
	if err != nil {
		return dataplane.State{}, err
	}
	cur, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("retire %s: %w", b.cfg.Device, err)
	}
	var st dataplane.State
	switch cur.Device.Port {
	case int(s.ToPort): // a replay: the receiver is the device already
		st = b.state(cur)
	case int(s.FromPort):
		// Remotes switched to the new port are, on the device that will
		// own it, on their device's port.
		for i := range cur.FDB {
			if cur.FDB[i].Port == int(s.ToPort) {
				cur.FDB[i].Port = 0
			}
		}
		w, err := b.cfg.VXLAN.Recreate(cur, int(s.ToPort))
		if err != nil {
			return dataplane.State{}, fmt.Errorf("retire %s: %w", b.cfg.Device, err)
		}
		after, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
		if err != nil {
			return dataplane.State{}, fmt.Errorf("retire %s: read back: %w", b.cfg.Device, err)
		}
		st = b.stateWith(outcome{w: w, moved: true, after: after})
	default:
		return b.state(cur), fmt.Errorf("retire %s: the device is on port %d, neither %d nor %d: something else moved it; not touching it", b.cfg.Device, cur.Device.Port, s.FromPort, s.ToPort)
	}
	if st.Port != s.ToPort {
		return st, fmt.Errorf("retire %s: read back port %d, want %d", b.cfg.Device, st.Port, s.ToPort)
	}
	if sd.RPFilter >= 0 {
		if err := b.cfg.VXLAN.SetReversePathFilter(b.cfg.Device, sd.RPFilter); err != nil {
			return st, fmt.Errorf("retire %s: put rp_filter %d back: %w", b.cfg.Device, sd.RPFilter, err)
		}
	}
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return st, fmt.Errorf("retire %s: remove the old device: %w", b.cfg.Device, err)
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Close(s.FromPort, nil); err != nil {
			return st, err
		}
	}
	b.forget(&st, s.FromPort)
	return st, nil
}
