// Package kernelvxlan is the "kernel-vxlan" dataplane backend: it moves the
// UDP port of a kernel VXLAN device (flannel's flannel.1, Calico's
// vxlan.calico, Cilium's cilium_vxlan) by recreating the device on the new
// port with everything bound to it (pkg/vxlan), opens and closes the port in
// the node firewall around it, and deletes the conntrack entries of the port
// it leaves.
//
// It acts only through pkg/vxlan, pkg/udpport, pkg/conntrack and the
// dataplane.Firewall, so the same code runs against the kernel and the fakes;
// it must not speak netlink or exec anything itself, and must not touch any
// link but its device (pkg/vxlan's temporary names included).
//
// # What the CNI's own agent does afterwards
//
// The kernel cannot change a VXLAN device's port in place, so the device is
// new (same name, MAC, addresses, FDB, neighbours, routes; new ifindex).
// Each CNI keeps its own idea of the port and must be told, or it moves the
// device back. Updating that source of truth through the Kubernetes API is
// the finalize step of the Kubernetes integration, not this package's job;
// docs/kernel-vxlan.md has the details and the sources they come from:
//
//   - flannel reads net-conf.json (ConfigMap kube-flannel-cfg) only at start.
//     At start it keeps an existing flannel.<VNI> whose attributes are
//     compatible and deletes and recreates (new random MAC) one that is not;
//     the port counts only when both sides are non-zero. So Backend.Port must
//     be set to the new port before any flanneld restarts. flanneld also
//     caches the device's ifindex: until it restarts, peers that join later
//     get no route/ARP/FDB entries on this node. Restart flanneld (rolling)
//     after the ConfigMap change.
//   - Calico Felix re-checks its VXLAN device in a loop and recreates it on
//     its configured FelixConfiguration vxlanPort when the port differs, so
//     vxlanPort must change together with the cutover (within one Felix
//     device-sync interval, 10 s), or Felix moves each node back.
//   - Cilium's cilium_vxlan is flow-based (external) and has BPF programs
//     attached that a recreation does not carry over; Preflight refuses such
//     a device unless Config.AllowFlowBased says the operator restarts
//     cilium-agent (with tunnel-port changed in cilium-config) right after.
package kernelvxlan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/conntrack"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// Name is the backend's name in snapshots and flags.
const Name = "kernel-vxlan"

// DefaultDevice is flannel's device for its default VNI 1.
const DefaultDevice = "flannel.1"

// Config wires the backend to its drivers.
type Config struct {
	// Device is the VXLAN device: flannel.1 (default), vxlan.calico,
	// cilium_vxlan.
	Device string
	// VXLAN reads and recreates the device (vxlan.Kernel or vxlan.Fake).
	VXLAN vxlan.Interface
	// Firewall opens the target port before the flip; nil manages nothing.
	Firewall *dataplane.Firewall
	// Ports checks that the target port is free; nil skips the check.
	Ports udpport.Checker
	// Conntrack deletes the entries of the port the device leaves; nil
	// leaves them to expire (UDP: 30 s unreplied, 120 s assured).
	Conntrack conntrack.Interface
	// AllowFlowBased lets Preflight pass a flow-based (external) device such
	// as Cilium's: what is attached to it (tc/BPF) is lost by the
	// recreation and its agent must be restarted right after.
	AllowFlowBased bool
}

// Backend implements dataplane.Backend over a kernel VXLAN device.
type Backend struct {
	cfg Config
	mu  sync.Mutex
	// armed is what ArmCommit read for the Commit of one snapshot; only
	// a speed-up: every step still works from the snapshot alone.
	armed *armedCommit
}

var (
	_ dataplane.Backend     = (*Backend)(nil)
	_ dataplane.CommitArmer = (*Backend)(nil)
)

// New returns the backend; the kernel is not contacted yet.
func New(cfg Config) (*Backend, error) {
	if cfg.Device == "" {
		cfg.Device = DefaultDevice
	}
	if len(cfg.Device) > 15 || strings.ContainsAny(cfg.Device, "/ \t\n:") {
		return nil, fmt.Errorf("kernel-vxlan backend: device %q: must be a Linux interface name (1-15 characters, no '/', ':' or spaces)", cfg.Device)
	}
	if cfg.VXLAN == nil {
		return nil, errors.New("kernel-vxlan backend: vxlan: no driver (use vxlan.Open, or Open for the whole set)")
	}
	return &Backend{cfg: cfg}, nil
}

// snapshotData is the backend-specific part of a dataplane.Snapshot.
type snapshotData struct {
	// Device is the full device as it was before Prepare: what Revert
	// rebuilds when a recreation was interrupted and the device is gone.
	Device vxlan.Snapshot `json:"device"`
	// ToRulesPresent records which target-port rules existed before
	// Prepare, so undoing Prepare removes only what Cutover added.
	ToRulesPresent map[string]bool `json:"to_rules_present,omitempty"`
	// RPFilter is the device's own rp_filter before the operation (-1:
	// unknown). The staged strategy's receiver has it off and becomes the
	// device at Retire, which then puts this value back (staged.go).
	RPFilter int `json:"rp_filter"`
}

// Name implements dataplane.Backend.
func (b *Backend) Name() string { return Name }

// Device implements dataplane.Backend.
func (b *Backend) Device() string { return b.cfg.Device }

// Read implements dataplane.Backend.
func (b *Backend) Read(context.Context) (dataplane.State, error) {
	s, err := b.readDevice()
	if err != nil {
		return dataplane.State{}, err
	}
	return b.state(s), nil
}

// readDevice reads the managed device. Read, Ready and Preflight report a
// failure in these same words, so that the agent and the coordinator can
// say it once; vxlan.IsNotFound and IsNotVXLAN still hold.
func (b *Backend) readDevice() (vxlan.Snapshot, error) {
	s, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	switch {
	case err == nil:
		return s, nil
	case vxlan.IsNotFound(err):
		return s, fmt.Errorf("kernel VXLAN device %s does not exist on this node (is the CNI running? is --kernel-device right?): %w", b.cfg.Device, err)
	case vxlan.IsNotVXLAN(err):
		return s, fmt.Errorf("device %s: %w (--kernel-device must name the overlay's VXLAN device)", b.cfg.Device, err)
	}
	return s, fmt.Errorf("kernel VXLAN device %s: %w", b.cfg.Device, err)
}

func (b *Backend) state(s vxlan.Snapshot) dataplane.State {
	st := b.linkState(s.Device)
	st.Detail["fdb"] = strconv.Itoa(len(s.FDB))
	st.Detail["neighbors"] = strconv.Itoa(len(s.Neighbors))
	st.Detail["routes"] = strconv.Itoa(len(s.Routes))
	return st
}

// linkState is state without what hangs off the device (the counts of
// FDB entries, neighbours and routes): what one link lookup tells.
func (b *Backend) linkState(d vxlan.Device) dataplane.State {
	state := "down"
	if d.Up {
		state = "up"
	}
	return dataplane.State{Backend: Name, Device: b.cfg.Device, Port: tunnelport.Port(d.Port), Detail: map[string]string{
		"vni": strconv.Itoa(d.VNI), "mac": d.MAC, "mtu": strconv.Itoa(d.MTU), "state": state,
		"ifindex": strconv.Itoa(d.Index),
	}}
}

// Preflight implements dataplane.Backend. It only reads.
func (b *Backend) Preflight(_ context.Context, to tunnelport.Port) (dataplane.Check, error) {
	var c dataplane.Check
	s, err := b.readDevice()
	if err != nil {
		c.Problems = append(c.Problems, err.Error())
		// CurrentPort stays 0 (unknown); the target port is still checked,
		// so that TargetFree is an answer and not a zero value.
		c.TargetFree = b.checkTarget(&c, to, 0)
		return c, nil
	}
	d := s.Device
	c.CurrentPort = tunnelport.Port(d.Port)
	switch {
	case to == 0:
		c.Problems = append(c.Problems, "target port 0: must be a UDP port 1-65535")
	case int(to) == d.Port:
		c.Problems = append(c.Problems, fmt.Sprintf("target port %d: device %s already uses it: nothing to change; pick another port", to, b.cfg.Device))
	}
	if !d.Up {
		c.Problems = append(c.Problems, fmt.Sprintf("device %s is down: the overlay does not work on this node now; fix that before a cutover", b.cfg.Device))
	}
	if d.FlowBased && !b.cfg.AllowFlowBased {
		c.Problems = append(c.Problems, fmt.Sprintf("device %s is flow-based (external, as Cilium's): the tc/BPF programs its agent attached to it are lost when it is recreated; allow it only if that agent is restarted right after the commit", b.cfg.Device))
	}
	if err := s.Validate(); err != nil {
		c.Problems = append(c.Problems, err.Error())
	}
	c.TargetFree = b.checkTarget(&c, to, d.Port)
	c.Problems = append(c.Problems, b.cfg.Firewall.Problems()...)

	open, closeOld := b.cfg.Firewall.Actions(c.CurrentPort, to)
	nftProblems, nftOpen, nftClose := b.cfg.Firewall.NFTCheck(c.CurrentPort, to)
	c.Problems = append(c.Problems, nftProblems...)
	open, closeOld = append(open, nftOpen...), append(closeOld, nftClose...)
	c.Actions = append(c.Actions, open...)
	c.Actions = append(c.Actions, fmt.Sprintf(
		"recreate %s (vxlan id %d, mac %s) on port %d: build it under a temporary name with %d address(es), %d FDB entr(ies), %d neighbour(s) while %s carries traffic; "+
			"rename %s away and the new device to %s and up in one request; move %d route(s); delete the old device after the window "+
			"(pkg/vxlan prebuilt strategy: window measured median 0.56 ms, p90 3.8 ms; ~12 ms on kernels that refuse renaming a running link)",
		b.cfg.Device, d.VNI, d.MAC, to, len(s.Addrs), len(s.FDB), len(s.Neighbors), b.cfg.Device, b.cfg.Device, b.cfg.Device, len(s.Routes)))
	if b.cfg.Conntrack != nil {
		c.Actions = append(c.Actions, fmt.Sprintf("conntrack: delete the UDP entries whose original destination port is %d (IPv4 and IPv6), nothing else", d.Port))
	} else {
		c.Actions = append(c.Actions, fmt.Sprintf("conntrack: entries for port %d left to expire (cleanup off)", d.Port))
	}
	c.Actions = append(c.Actions, "read the device back")
	c.Actions = append(c.Actions, closeOld...)
	if note := cniNote(b.cfg.Device, to); note != "" {
		c.Actions = append(c.Actions, note)
	}
	return c, nil
}

// checkTarget reports whether port to is free on this node (current, the
// device's own port, is not asked about), adding to c who holds it or why
// that cannot be told (then it counts as free: the problem already stops
// the cutover, and "held" would be a false claim).
func (b *Backend) checkTarget(c *dataplane.Check, to tunnelport.Port, current int) bool {
	if b.cfg.Ports == nil || to == 0 || int(to) == current {
		return true
	}
	free, holder, err := b.cfg.Ports.Free(uint16(to))
	switch {
	case err != nil:
		c.Problems = append(c.Problems, fmt.Sprintf("port %d: cannot tell whether it is free: %v", to, err))
	case !free && holder.Kind == "vxlan" && (holder.Device == vxlan.OldName(b.cfg.Device) || holder.Device == vxlan.TmpName(b.cfg.Device)):
		// The old device of our own last cutover, kept until its
		// Finalize (a Finalize not yet run or that failed), or what an
		// undo that failed half way left: Prebuild and Recreate remove
		// them before building on the port.
		c.Actions = append(c.Actions, fmt.Sprintf("remove %s (left by the last operation on %s, on port %d)", holder.Device, b.cfg.Device, to))
	case !free:
		c.TargetHolder = holder.String()
		hint := ""
		if holder.Kind == "vxlan" || holder.Kind == "geneve" {
			hint = " (a tunnel device holds its port even while down)"
		}
		c.Problems = append(c.Problems, fmt.Sprintf("port %d is in use on this node by %s%s", to, holder, hint))
		return false
	}
	return true
}

// cniNote says what outside this backend must change for a known device.
func cniNote(dev string, to tunnelport.Port) string {
	switch {
	case strings.HasPrefix(dev, "flannel."):
		return fmt.Sprintf(`outside this backend: set "Backend": {"Port": %d} in net-conf.json (ConfigMap kube-flannel-cfg), then restart flanneld on every node so it picks up the new ifindex`, to)
	case dev == "vxlan.calico" || dev == "vxlan-v6.calico":
		return fmt.Sprintf("outside this backend: set FelixConfiguration vxlanPort: %d at once, or Felix recreates the device on its configured port", to)
	case dev == "cilium_vxlan":
		return fmt.Sprintf("outside this backend: set tunnel-port: %q in ConfigMap cilium-config and restart cilium-agent", strconv.Itoa(int(to)))
	}
	return ""
}

// Snapshot implements dataplane.Backend.
func (b *Backend) Snapshot(_ context.Context, from, to tunnelport.Port) (dataplane.Snapshot, error) {
	if from == 0 || to == 0 || from == to {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: ports %d -> %d: need two different UDP ports 1-65535", b.cfg.Device, from, to)
	}
	s, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	if err != nil {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: %w", b.cfg.Device, err)
	}
	if s.Device.Port != int(from) {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: current port is %d, not %d (from_port): the request was planned on a stale view or something moved the port since; plan again", b.cfg.Device, s.Device.Port, from)
	}
	if err := s.Validate(); err != nil {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: %w", b.cfg.Device, err)
	}
	sd := snapshotData{Device: s, RPFilter: -1}
	if rp, _, err := b.cfg.VXLAN.ReversePathFilter(b.cfg.Device); err == nil {
		sd.RPFilter = rp
	}
	if b.cfg.Firewall != nil {
		if sd.ToRulesPresent, err = b.cfg.Firewall.Present(to); err != nil {
			return dataplane.Snapshot{}, err
		}
	}
	raw, err := json.Marshal(sd)
	if err != nil {
		return dataplane.Snapshot{}, err
	}
	return dataplane.Snapshot{Backend: Name, Device: b.cfg.Device, FromPort: from, ToPort: to, Data: raw}, nil
}

func (b *Backend) decode(s dataplane.Snapshot) (snapshotData, error) {
	var sd snapshotData
	if s.Backend != Name {
		return sd, fmt.Errorf("snapshot is for backend %q, not %s: the operation was recorded by another backend; run the agent with --backend %s to finish or roll it back", s.Backend, Name, s.Backend)
	}
	if s.Device != b.cfg.Device {
		return sd, fmt.Errorf("snapshot is for device %q, this backend manages %q: run the agent with --kernel-device %s to finish or roll the operation back", s.Device, b.cfg.Device, s.Device)
	}
	if err := json.Unmarshal(s.Data, &sd); err != nil {
		return sd, fmt.Errorf("snapshot data: %w", err)
	}
	if sd.Device.Device.Name != b.cfg.Device || sd.Device.Device.Port != int(s.FromPort) {
		return sd, fmt.Errorf("snapshot data: device %q port %d does not match the snapshot's %q port %d",
			sd.Device.Device.Name, sd.Device.Device.Port, b.cfg.Device, s.FromPort)
	}
	return sd, nil
}

// Prepare implements dataplane.Backend: the target port is opened and the
// new device is prebuilt (pkg/vxlan Prebuild): down, under its temporary
// name, with the FDB and neighbours read now but no addresses, so it holds
// no port and attracts no traffic. Commit adopts it and only tops it up
// with what the CNI changed since. Building it here took the build (up to
// 0.6 s per node when 32 lab nodes flip on one kernel, make bench-lab-n32)
// out of the time between the commit instant and the flip.
func (b *Backend) Prepare(_ context.Context, s dataplane.Snapshot) error {
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
		return fmt.Errorf("prepare %s: %w", b.cfg.Device, err)
	}
	if cur.Device.Port != int(s.FromPort) {
		return fmt.Errorf("prepare %s: the device is on port %d, not %d: something else changed it since the snapshot; not preparing", b.cfg.Device, cur.Device.Port, s.FromPort)
	}
	if diff := deviceDiff(sd.Device.Device, cur.Device); diff != "" {
		return fmt.Errorf("prepare %s: the device changed since the snapshot (%s): abort and prepare again", b.cfg.Device, diff)
	}
	if _, err := b.cfg.VXLAN.Prebuild(cur, int(s.ToPort)); err != nil {
		return fmt.Errorf("prepare %s: prebuild the device on port %d: %w", b.cfg.Device, s.ToPort, err)
	}
	return nil
}

// outcome is what move did.
type outcome struct {
	w     vxlan.Window
	moved bool
	// after is the device read back: in full for a replay or a failure,
	// only its link (Device) after a move (linkOnly).
	after    vxlan.Snapshot
	linkOnly bool
	readBack time.Duration // the read-back after the move
	armed    string        // what became of ArmCommit's read (Commit only)
}

// move brings the device from port from to port to, idempotently:
//   - already on to: nothing (a replay);
//   - on from: recreated from a fresh read of the device, so that FDB
//     entries, neighbours and routes the CNI added since the snapshot are
//     kept; checkIdentity refuses a device whose configuration changed;
//   - gone: a recreation interrupted inside its window (the agent died):
//     rebuilt on to from the persisted snapshot, its last full state;
//   - on any other port: someone else moved it; not touched.
func (b *Backend) move(op string, prior vxlan.Snapshot, from, to tunnelport.Port, checkIdentity bool) (outcome, error) {
	cur, err := b.cfg.VXLAN.Snapshot(b.cfg.Device)
	base := cur
	switch {
	case vxlan.IsNotFound(err):
		base = prior
	case err != nil:
		return outcome{}, fmt.Errorf("%s %s: %w", op, b.cfg.Device, err)
	case cur.Device.Port == int(to):
		return outcome{after: cur, w: vxlan.Window{Strategy: "noop"}}, nil
	case cur.Device.Port != int(from):
		return outcome{after: cur}, fmt.Errorf("%s %s: current port %d is neither %d nor %d: something else changed it; not touching it: find out what (the CNI?), set it back to %d, then retry",
			op, b.cfg.Device, cur.Device.Port, from, to, from)
	case checkIdentity:
		if diff := deviceDiff(prior.Device, cur.Device); diff != "" {
			return outcome{after: cur}, fmt.Errorf("%s %s: the device changed since the snapshot (%s): not recreating it from a stale picture; roll back and prepare again",
				op, b.cfg.Device, diff)
		}
	}
	w, err := b.cfg.VXLAN.Recreate(base, int(to))
	if err != nil {
		return outcome{w: w}, fmt.Errorf("%s %s %d->%d: %w", op, b.cfg.Device, from, to, err)
	}
	return b.readBack(op, w, to)
}

// readBack confirms a move with one link lookup: the port is what the
// answer carries. The full read (FDB, neighbours, routes: six dumps) is
// for the log and waits until after the answer (AfterCommit).
func (b *Backend) readBack(op string, w vxlan.Window, to tunnelport.Port) (outcome, error) {
	t0 := time.Now()
	d, err := b.cfg.VXLAN.Link(b.cfg.Device)
	if err != nil {
		return outcome{w: w, moved: true}, fmt.Errorf("%s %s: read back: %w", op, b.cfg.Device, err)
	}
	after := vxlan.Snapshot{Device: d}
	if d.Port != int(to) {
		return outcome{w: w, moved: true, after: after, linkOnly: true}, fmt.Errorf("%s %s: read back port %d, want %d", op, b.cfg.Device, d.Port, to)
	}
	return outcome{w: w, moved: true, after: after, linkOnly: true, readBack: time.Since(t0)}, nil
}

// deviceDiff names the device attributes that differ, ignoring the port and
// the ifindex (both change with every recreation).
func deviceDiff(a, b vxlan.Device) string {
	a.Port, b.Port, a.Index, b.Index = 0, 0, 0, 0
	if a.Up != b.Up {
		return fmt.Sprintf("up %v -> %v", a.Up, b.Up)
	}
	ta := vxlan.Snapshot{Device: a}.Text()
	tb := vxlan.Snapshot{Device: b}.Text()
	if ta != tb {
		return fmt.Sprintf("%q -> %q", strings.TrimSpace(ta), strings.TrimSpace(tb))
	}
	return ""
}

// forget deletes conntrack entries of the port the device left; a failure
// is reported in the state's detail, not as an error: the device moved, and
// stale entries only expire later (the caller must not roll back the
// cluster for them).
func (b *Backend) forget(st *dataplane.State, port tunnelport.Port) {
	if b.cfg.Conntrack == nil {
		return
	}
	t0 := time.Now()
	n, err := b.cfg.Conntrack.DeleteUDPDstPort(uint16(port))
	st.Detail["conntrack_us"] = strconv.FormatInt(time.Since(t0).Microseconds(), 10)
	st.Detail["conntrack_deleted"] = strconv.Itoa(n)
	if err != nil {
		st.Detail["conntrack_error"] = err.Error()
	}
}

func (b *Backend) stateWith(o outcome) dataplane.State {
	st := b.state(o.after)
	if o.linkOnly {
		st = b.linkState(o.after.Device)
	}
	if o.armed != "" {
		st.Detail["armed"] = o.armed
	}
	w := o.w
	st.Detail["strategy"] = w.Strategy
	st.Detail["window_us"] = strconv.FormatInt(w.Total.Microseconds(), 10)
	st.Detail["absent_us"] = strconv.FormatInt(w.Absent.Microseconds(), 10)
	st.Detail["prepare_us"] = strconv.FormatInt(w.Prepare.Microseconds(), 10)
	st.Detail["cleanup_us"] = strconv.FormatInt(w.Cleanup.Microseconds(), 10)
	st.Detail["calls"] = strconv.Itoa(w.Calls)
	st.Detail["prebuilt"] = strconv.FormatBool(w.Adopted)
	st.Detail["readback_us"] = strconv.FormatInt(o.readBack.Microseconds(), 10)
	st.Written, st.Effective = w.Start, w.End
	return st
}

// Commit implements dataplane.Backend: recreate on the target port, delete
// the old port's conntrack entries, read back. Detail carries vni and the
// measured window (window_us, absent_us; prepare_us is spent before the old
// device is touched).
func (b *Backend) Commit(_ context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	ac := b.takeArmed(s)
	sd, err := b.decode(s)
	if err != nil {
		if ac != nil {
			ac.a.Close()
		}
		return dataplane.State{}, err
	}
	armed := "no"
	if ac != nil {
		o, ok, why, err := b.moveArmed(ac, s.ToPort)
		if ok {
			if err != nil {
				return dataplane.State{}, err
			}
			o.armed = "used (" + strconv.FormatInt(ac.dur.Microseconds(), 10) + " us ahead)"
			return b.stateWith(o), nil
		}
		armed = "stale, read afresh: " + why
	}
	o, err := b.move("commit", sd.Device, s.FromPort, s.ToPort, true)
	if err != nil {
		return dataplane.State{}, err
	}
	o.armed = armed
	// The old port's conntrack entries go in AfterCommit, after the
	// answer.
	return b.stateWith(o), nil
}

// AfterCommit implements dataplane.AfterCommitter: the old port's
// conntrack entries are deleted, also on a replay (entries may have come
// back since: a peer still sending to the old port). Stale entries only
// expire later, so nothing waits for this: the deletion dumps the
// kernel's whole conntrack table (every namespace's), which took
// 90-220 ms per node in an 8-node lab and held every answer back by as
// much.
func (b *Backend) AfterCommit(_ context.Context, s dataplane.Snapshot) (map[string]string, error) {
	if _, err := b.decode(s); err != nil {
		return nil, err
	}
	st := dataplane.State{Detail: map[string]string{}}
	// The full read-back, for the log: Commit confirmed the port with one
	// link lookup.
	t0 := time.Now()
	if full, err := b.cfg.VXLAN.Snapshot(b.cfg.Device); err == nil {
		st.Detail["fdb"] = strconv.Itoa(len(full.FDB))
		st.Detail["neighbors"] = strconv.Itoa(len(full.Neighbors))
		st.Detail["routes"] = strconv.Itoa(len(full.Routes))
		st.Detail["readback_full_us"] = strconv.FormatInt(time.Since(t0).Microseconds(), 10)
	} else {
		st.Detail["readback_error"] = err.Error()
	}
	b.forget(&st, s.FromPort)
	if e := st.Detail["conntrack_error"]; e != "" {
		return st.Detail, errors.New(e)
	}
	return st.Detail, nil
}

// Revert implements dataplane.Backend: back to the snapshot's port (a no-op
// when already there), then the target port's rules Prepare added go.
func (b *Backend) Revert(_ context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	b.disarm()
	sd, err := b.decode(s)
	if err != nil {
		return dataplane.State{}, err
	}
	o, err := b.move("revert", sd.Device, s.ToPort, s.FromPort, false)
	if err != nil {
		if o.after.Device.Name != "" {
			if o.linkOnly {
				return b.linkState(o.after.Device), err
			}
			return b.state(o.after), err
		}
		return dataplane.State{}, err
	}
	st := b.stateWith(o)
	if o.moved {
		b.forget(&st, s.ToPort)
	}
	// What the change left goes too: the device that was on the target
	// port (renamed away by the move back, still up: its socket holds the
	// port) and a prebuilt device never committed. Left for the next
	// operation, they made a retry to the same port fail its path check
	// ("not free": the check binds the port) and kept a Cutover device on
	// a node the operation was over for. The deletion holds the
	// kernel's RTNL lock for tens of milliseconds, after this node's move
	// back: on separate kernels no other node waits for it.
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return st, fmt.Errorf("revert %s: back on port %d, but what the change left on port %d stays: %w (roll back again to retry)", b.cfg.Device, s.FromPort, s.ToPort, err)
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Abort implements dataplane.Backend: the prebuilt device and the target
// port's rules Prepare added go.
func (b *Backend) Abort(_ context.Context, s dataplane.Snapshot) error {
	b.disarm()
	sd, err := b.decode(s)
	if err != nil {
		return err
	}
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return fmt.Errorf("abort %s: remove the prebuilt device: %w", b.cfg.Device, err)
	}
	if b.cfg.Firewall == nil {
		return nil
	}
	return b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent)
}

// Finalize implements dataplane.Backend: the old port's rules go, but only
// once the device is read back on the new port — closing the old port under
// a device still on it would cut the node off. Then the old port's
// conntrack entries are deleted again: peers that flipped a little later
// than this node (the commit skew) sent to the old port after Commit's
// deletion, and with the rules gone no new entry is confirmed.
func (b *Backend) Finalize(ctx context.Context, s dataplane.Snapshot) error {
	if _, err := b.decode(s); err != nil {
		return err
	}
	st, err := b.Read(ctx)
	if err != nil {
		return fmt.Errorf("finalize %s: %w", b.cfg.Device, err)
	}
	if st.Port != s.ToPort {
		return fmt.Errorf("finalize %s: the device is on port %d, not %d (the port this operation moved it to): not closing port %d; something changed it after the commit: find out what (the CNI?), then move it back to %d or roll the operation back",
			b.cfg.Device, st.Port, s.ToPort, s.FromPort, s.ToPort)
	}
	// The old device, renamed and stripped at Commit, still holds the old
	// port: it goes before the old port's rules do.
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return fmt.Errorf("finalize %s: remove the old device: %w", b.cfg.Device, err)
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Close(s.FromPort, nil); err != nil {
			return err
		}
	}
	if b.cfg.Conntrack != nil {
		if _, err := b.cfg.Conntrack.DeleteUDPDstPort(uint16(s.FromPort)); err != nil {
			return fmt.Errorf("finalize %s: old port's rules closed; conntrack cleanup of port %d failed (retry Finalize): %w", b.cfg.Device, s.FromPort, err)
		}
	}
	return nil
}

// Ready implements dataplane.Backend.
func (b *Backend) Ready(context.Context) []string {
	var out []string
	if _, err := b.readDevice(); err != nil {
		out = append(out, err.Error())
	}
	return append(out, b.cfg.Firewall.Problems()...)
}

// KeepPortOpen implements dataplane.PortKeeper: the port the device is on
// now, read back, kept open in the firewall.
func (b *Backend) KeepPortOpen(ctx context.Context, removeStale bool) (dataplane.Kept, error) {
	st, err := b.Read(ctx)
	if err != nil {
		return dataplane.Kept{}, err
	}
	if st.Port == 0 {
		return dataplane.Kept{}, fmt.Errorf("keep the overlay port open: %s reads back no port", b.Device())
	}
	return b.cfg.Firewall.KeepOpen(st.Port, removeStale)
}

// CleanupNode implements dataplane.NodeCleaner: the twin devices of the
// device (the prebuilt or receiving one, cotx…; the old one, cotd…), and
// the firewall rules the agent marked as its own. The device itself stays.
func (b *Backend) CleanupNode(context.Context) ([]string, error) {
	var out []string
	for _, n := range []string{vxlan.TmpName(b.cfg.Device), vxlan.OldName(b.cfg.Device)} {
		if _, err := b.cfg.VXLAN.Snapshot(n); err == nil {
			out = append(out, "device "+n)
		}
	}
	if err := b.cfg.VXLAN.Cleanup(b.cfg.Device); err != nil {
		return nil, fmt.Errorf("cleanup %s: %w", b.cfg.Device, err)
	}
	rules, err := b.cfg.Firewall.RemoveKept()
	for _, r := range rules {
		out = append(out, "rule "+r)
	}
	return out, err
}
