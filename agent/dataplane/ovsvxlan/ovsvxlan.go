// Package ovsvxlan is the "ovs" dataplane backend: it moves the UDP port of
// an OVS VXLAN interface (OpenShift SDN's vxlan0 on br0) with one
// compare-and-set OVSDB transaction, and opens and closes the port in the
// node firewall around it.
//
// It acts only through the pkg/ovs driver, the dataplane.Firewall and a
// udpport.Checker, so the same code runs against real OVS and the fakes.
package ovsvxlan

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

// Config wires the backend to its drivers.
type Config struct {
	OVS       ovs.Driver
	Interface string // the VXLAN interface, "vxlan0"
	// Bridge is the bridge the interface belongs on ("br0"), for messages:
	// an operator who finds the interface missing looks there.
	Bridge   string
	Firewall *dataplane.Firewall
	Ports    udpport.Checker // nil: no port-free check
	// Flows, when set, are OpenFlow flows that carry the port (the
	// openshift-sdn profile's drop flow, sdn.go): opened, closed and
	// reported like the firewall rules.
	Flows *PortFlows
	// OF serves the staged strategy (staged.go): the bridge's flow
	// table. Nil: staged is refused. Its ports go through OVS.
	OF openflow.Interface
	// SDN says the openshift-sdn profile is on: staged is refused
	// (docs/openshift-sdn.md).
	SDN bool
	// RxLocalIP is the node IP the tunnel receives on (the agent's
	// --underlay-address). The staged receive port is bound to it
	// (options:local_ip), which makes it a more specific tunnel than
	// vxlan0: both stay registered while the retirement moves vxlan0 onto
	// the receive port's UDP port. Invalid: staged is refused.
	RxLocalIP netip.Addr
	// StandingRedirects keeps the staged strategy's two redirect flows on
	// the bridge between operations (Keep installs them; Listen reuses
	// them; the retirement and the undo leave them, dormant while no port
	// has their OpenFlow numbers), so that a staged operation makes no
	// flow table change: on a userspace datapath each one stalls the
	// node's forwarding (docs/staged.md). Off: the listen adds them and
	// the retirement removes them, the atomic strategy's end state.
	StandingRedirects bool
}

// Backend implements dataplane.Backend over OVS.
type Backend struct {
	cfg Config

	// pending is the change Prepare built, so that Commit sends one
	// transaction at the instant. It is a cache: after an agent restart
	// it is gone and Commit builds the change itself (SetDstPort).
	mu      sync.Mutex
	pending *pendingChange
	// applied is the change a Commit applied, closed by AfterCommit:
	// closing cancels its cur_cfg monitor, a round trip to ovsdb-server
	// the answer need not wait for.
	applied ovs.PreparedChange

	// staged serializes the staged phases with Keep, which read the
	// flow table and then change it.
	staged sync.Mutex
}

type pendingChange struct {
	from, to tunnelport.Port
	change   ovs.PreparedChange
}

var (
	_ dataplane.Backend        = (*Backend)(nil)
	_ dataplane.AfterCommitter = (*Backend)(nil)
)

// New returns the backend; the drivers are not contacted yet.
func New(cfg Config) (*Backend, error) {
	if cfg.OVS == nil {
		return nil, fmt.Errorf("ovs backend: no OVS driver")
	}
	if cfg.Interface == "" {
		return nil, fmt.Errorf("ovs backend: interface: must name the VXLAN interface (e.g. vxlan0)")
	}
	return &Backend{cfg: cfg}, nil
}

// snapshot is the backend-specific part of a dataplane.Snapshot.
type snapshot struct {
	Options map[string]string `json:"options"`
	OFPort  int64             `json:"ofport"`
	// ToRulesPresent records which target-port rules existed before
	// Prepare, so undoing Prepare removes only what Cutover added.
	ToRulesPresent map[string]bool `json:"to_rules_present,omitempty"`
	// ToFlowsPresent is the same for Config.Flows.
	ToFlowsPresent map[string]bool `json:"to_flows_present,omitempty"`
}

// Name implements dataplane.Backend.
func (b *Backend) Name() string { return "ovs" }

// Device implements dataplane.Backend.
func (b *Backend) Device() string { return b.cfg.Interface }

// Read implements dataplane.Backend.
func (b *Backend) Read(ctx context.Context) (dataplane.State, error) {
	iface, err := b.getInterface(ctx)
	if err != nil {
		return dataplane.State{}, err
	}
	return b.state(iface)
}

// getInterface reads the managed interface. Read, Ready, Preflight and
// Finalize all report a failure in these same words, so that the agent and
// the coordinator can say it once: a missing interface is named as missing
// (ovs.IsNotFound still holds), not as an unreadable port.
func (b *Backend) getInterface(ctx context.Context) (ovs.Interface, error) {
	iface, err := b.cfg.OVS.GetInterface(ctx, b.cfg.Interface)
	switch {
	case ovs.IsNotFound(err):
		where := "OVS"
		if b.cfg.Bridge != "" {
			where = "OVS bridge " + b.cfg.Bridge
		}
		return iface, fmt.Errorf("%s not found in %s: %w (deleted by hand? restarting the CNI recreates it; else check --interface and --bridge)",
			b.cfg.Interface, where, err)
	case err != nil:
		return iface, fmt.Errorf("OVS interface %s: %w", b.cfg.Interface, err)
	}
	return iface, nil
}

func (b *Backend) state(iface ovs.Interface) (dataplane.State, error) {
	port, err := iface.DstPort()
	if err != nil {
		return dataplane.State{}, fmt.Errorf("OVS %w", err) // err names the interface
	}
	d := map[string]string{"type": iface.Type, "ofport": strconv.FormatInt(iface.OFPort, 10)}
	if iface.Error != "" {
		d["error"] = iface.Error
	}
	return dataplane.State{Backend: b.Name(), Device: b.cfg.Interface, Port: tunnelport.Port(port), Detail: d}, nil
}

// Preflight implements dataplane.Backend.
func (b *Backend) Preflight(ctx context.Context, to tunnelport.Port) (dataplane.Check, error) {
	var c dataplane.Check
	iface, err := b.getInterface(ctx)
	if err != nil {
		// CurrentPort stays 0 (unknown): the coordinator must not count it
		// as a port this node is on. The target port is still checked, so
		// that TargetFree is an answer and not a zero value.
		c.Problems = append(c.Problems, err.Error())
		c.TargetFree = b.checkTarget(&c, to)
		return c, nil
	}
	st, err := b.state(iface)
	if err != nil {
		c.Problems = append(c.Problems, err.Error())
		c.TargetFree = b.checkTarget(&c, to)
		return c, nil
	}
	c.CurrentPort = st.Port
	if iface.Type != "vxlan" {
		c.Problems = append(c.Problems, fmt.Sprintf("OVS interface %s is of type %q, not vxlan: --interface must name the overlay's VXLAN interface", b.cfg.Interface, iface.Type))
	}
	if iface.OFPort < 1 || iface.Error != "" {
		c.Problems = append(c.Problems, fmt.Sprintf("OVS interface %s is failed already (ofport %d, error %q): fix it before a cutover", b.cfg.Interface, iface.OFPort, iface.Error))
	}
	if to == st.Port {
		c.Problems = append(c.Problems, fmt.Sprintf("target port %d: OVS interface %s already uses it: nothing to change; pick another port", to, b.cfg.Interface))
	}
	c.TargetFree = b.checkTarget(&c, to)
	c.Problems = append(c.Problems, b.cfg.Firewall.Problems()...)
	if b.cfg.Flows != nil {
		// A profile is on: say what of the CNI's it found.
		found, problems := b.found(ctx, st.Port)
		c.Actions = append(c.Actions, found...)
		c.Problems = append(c.Problems, problems...)
	}
	open, closeOld := b.cfg.Firewall.Actions(st.Port, to)
	nftProblems, nftOpen, nftClose := b.cfg.Firewall.NFTCheck(st.Port, to)
	c.Problems = append(c.Problems, nftProblems...)
	open, closeOld = append(open, nftOpen...), append(closeOld, nftClose...)
	flowsOpen, flowsClose := b.cfg.Flows.Actions(st.Port, to)
	open, closeOld = append(open, flowsOpen...), append(closeOld, flowsClose...)
	c.Actions = append(c.Actions, open...)
	c.Actions = append(c.Actions, fmt.Sprintf("ovsdb transact: wait Interface %s options:dst_port=%d, update options:dst_port=%d, next_cfg+1; wait cur_cfg; read back ofport/error", b.cfg.Interface, st.Port, to))
	c.Actions = append(c.Actions, closeOld...)
	return c, nil
}

// checkTarget reports whether port to is free on this node, adding to c
// who holds it or why that cannot be told (then it counts as free: the
// problem already stops the cutover, and "held" would be a false claim).
func (b *Backend) checkTarget(c *dataplane.Check, to tunnelport.Port) bool {
	if b.cfg.Ports == nil {
		return true
	}
	free, holder, err := b.cfg.Ports.Free(uint16(to))
	switch {
	case err != nil:
		c.Problems = append(c.Problems, fmt.Sprintf("port %d: cannot tell whether it is free: %v", to, err))
	case !free:
		c.TargetHolder = holder.String()
		c.Problems = append(c.Problems, fmt.Sprintf("port %d is in use on this node by %s", to, holder))
		return false
	}
	return true
}

// Snapshot implements dataplane.Backend.
func (b *Backend) Snapshot(ctx context.Context, from, to tunnelport.Port) (dataplane.Snapshot, error) {
	iface, err := b.getInterface(ctx)
	if err != nil {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	st, err := b.state(iface)
	if err != nil {
		return dataplane.Snapshot{}, err
	}
	if st.Port != from {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: current port is %d, not %d (from_port): the request was planned on a stale view or something moved the port since; plan again", b.cfg.Interface, st.Port, from)
	}
	sd := snapshot{Options: iface.Options, OFPort: iface.OFPort}
	if b.cfg.Firewall != nil {
		if sd.ToRulesPresent, err = b.cfg.Firewall.Present(to); err != nil {
			return dataplane.Snapshot{}, err
		}
	}
	if sd.ToFlowsPresent, err = b.cfg.Flows.Present(ctx, to); err != nil {
		return dataplane.Snapshot{}, err
	}
	raw, err := json.Marshal(sd)
	if err != nil {
		return dataplane.Snapshot{}, err
	}
	return dataplane.Snapshot{Backend: b.Name(), Device: b.cfg.Interface, FromPort: from, ToPort: to, Data: raw}, nil
}

func decode(s dataplane.Snapshot) (snapshot, error) {
	var sd snapshot
	if s.Backend != "ovs" {
		return sd, fmt.Errorf("snapshot is for backend %q, not ovs: the operation was recorded by another backend; run the agent with --backend %s to finish or roll it back", s.Backend, s.Backend)
	}
	if len(s.Data) > 0 {
		if err := json.Unmarshal(s.Data, &sd); err != nil {
			return sd, fmt.Errorf("snapshot data: %w", err)
		}
	}
	return sd, nil
}

// Prepare implements dataplane.Backend: the target port is opened and the
// OVSDB write is built (interface read, transaction, cur_cfg watch); OVS is
// not changed.
func (b *Backend) Prepare(ctx context.Context, s dataplane.Snapshot) error {
	if _, err := decode(s); err != nil {
		return err
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Open(s.ToPort); err != nil {
			return err
		}
	}
	if b.cfg.Flows != nil {
		if err := b.cfg.Flows.Add(ctx, s.ToPort); err != nil {
			return err
		}
	}
	change, err := b.cfg.OVS.PrepareDstPort(ctx, b.cfg.Interface, uint16(s.FromPort), uint16(s.ToPort))
	if err != nil {
		change.Close()
		return fmt.Errorf("prepare %s %d→%d: %w", b.cfg.Interface, s.FromPort, s.ToPort, err)
	}
	b.setPending(&pendingChange{from: s.FromPort, to: s.ToPort, change: change})
	return nil
}

// setPending replaces the cached change (nil drops it), releasing the old.
func (b *Backend) setPending(p *pendingChange) {
	b.mu.Lock()
	old := b.pending
	b.pending = p
	b.mu.Unlock()
	if old != nil {
		old.change.Close()
	}
}

// takePending hands over the cached change for from→to, if Prepare built one.
func (b *Backend) takePending(from, to tunnelport.Port) ovs.PreparedChange {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pending
	if p == nil || p.from != from || p.to != to {
		return nil
	}
	b.pending = nil
	return p.change
}

// Commit implements dataplane.Backend: one compare-and-set transaction,
// confirmed by ovs-vswitchd (cur_cfg) and read back. With the change
// Prepare built, that is one message at the instant; after an agent restart
// it is built here (two more round trips). Either way the compare-and-set
// refuses a row that changed since it was read.
func (b *Backend) Commit(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	change := b.takePending(s.FromPort, s.ToPort)
	if change == nil {
		var err error
		if change, err = b.cfg.OVS.PrepareDstPort(ctx, b.cfg.Interface, uint16(s.FromPort), uint16(s.ToPort)); err != nil {
			change.Close()
			return dataplane.State{}, fmt.Errorf("commit %s %d→%d: %w", b.cfg.Interface, s.FromPort, s.ToPort, err)
		}
	}
	iface, err := change.Apply(ctx)
	if err != nil {
		change.Close()
		return dataplane.State{}, fmt.Errorf("commit %s %d→%d: %w", b.cfg.Interface, s.FromPort, s.ToPort, err)
	}
	st, err := b.state(iface)
	st.Written, st.Effective = change.Timing()
	b.closeApplied(change)
	return st, err
}

// closeApplied keeps next to be closed after the commit's answer (nil:
// nothing), closing the one kept before, if any, now.
func (b *Backend) closeApplied(next ovs.PreparedChange) {
	b.mu.Lock()
	old := b.applied
	b.applied = next
	b.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// AfterCommit implements dataplane.AfterCommitter: the applied change's
// cur_cfg monitor is cancelled once the answer left.
func (b *Backend) AfterCommit(context.Context, dataplane.Snapshot) (map[string]string, error) {
	t0 := time.Now()
	b.closeApplied(nil)
	return map[string]string{"monitor_closed_after": time.Since(t0).String()}, nil
}

// Revert implements dataplane.Backend.
func (b *Backend) Revert(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	b.setPending(nil)
	sd, err := decode(s)
	if err != nil {
		return dataplane.State{}, err
	}
	st, err := b.Read(ctx)
	if err != nil {
		return dataplane.State{}, err
	}
	switch st.Port {
	case s.FromPort:
		// Never committed, or reverted already: nothing to flip.
	case s.ToPort:
		iface, err := b.cfg.OVS.SetDstPort(ctx, b.cfg.Interface, uint16(s.ToPort), uint16(s.FromPort))
		if err != nil {
			return dataplane.State{}, fmt.Errorf("revert %s %d→%d: %w", b.cfg.Interface, s.ToPort, s.FromPort, err)
		}
		if st, err = b.state(iface); err != nil {
			return dataplane.State{}, err
		}
	default:
		return st, fmt.Errorf("revert %s: current port %d is neither %d nor %d: something else changed it; not touching it: find out what (the CNI?), put it back (ovs-vsctl set interface %s options:dst_port=%d) and roll back again",
			b.cfg.Interface, st.Port, s.FromPort, s.ToPort, b.cfg.Interface, s.FromPort)
	}
	if b.cfg.Firewall != nil {
		if err := b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent); err != nil {
			return st, err
		}
	}
	if b.cfg.Flows != nil {
		if err := b.cfg.Flows.Remove(ctx, s.ToPort, sd.ToFlowsPresent); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Abort implements dataplane.Backend.
func (b *Backend) Abort(ctx context.Context, s dataplane.Snapshot) error {
	b.setPending(nil)
	sd, err := decode(s)
	if err != nil {
		return err
	}
	if b.cfg.Flows != nil {
		if err := b.cfg.Flows.Remove(ctx, s.ToPort, sd.ToFlowsPresent); err != nil {
			return err
		}
	}
	if b.cfg.Firewall == nil {
		return nil
	}
	return b.cfg.Firewall.Close(s.ToPort, sd.ToRulesPresent)
}

// Finalize implements dataplane.Backend: the old port's rules go, once the
// interface is read back on the new port. Removing them while it is still
// (or again) on the old one would cut this node off the overlay; a missing
// interface leaves nothing to say which port the node needs.
func (b *Backend) Finalize(ctx context.Context, s dataplane.Snapshot) error {
	if _, err := decode(s); err != nil {
		return err
	}
	st, err := b.Read(ctx)
	if err != nil {
		return fmt.Errorf("finalize: %w: not removing port %d's rules", err, s.FromPort)
	}
	if st.Port != s.ToPort {
		return fmt.Errorf("finalize: OVS interface %s is on port %d, not %d (the port this operation moved it to): not removing port %d's rules; something changed it after the commit: find out what (the CNI?), then move it back to %d or roll the operation back",
			b.cfg.Interface, st.Port, s.ToPort, s.FromPort, s.ToPort)
	}
	if b.cfg.Flows != nil {
		if err := b.cfg.Flows.Remove(ctx, s.FromPort, nil); err != nil {
			return err
		}
	}
	if b.cfg.Firewall == nil {
		return nil
	}
	return b.cfg.Firewall.Close(s.FromPort, nil)
}

// Ready implements dataplane.Backend.
func (b *Backend) Ready(ctx context.Context) []string {
	if err := b.cfg.OVS.Ping(ctx); err != nil {
		return []string{fmt.Sprintf("ovsdb: %v", err)}
	}
	var out []string
	if _, err := b.getInterface(ctx); err != nil {
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

// CleanupNode implements dataplane.NodeCleaner: the staged strategy's
// receive ports and every flow with Cutover's cookies (the redirects,
// standing ones included), then the firewall rules the agent marked as its
// own. vxlan0, br0 and the SDN's flows stay.
func (b *Backend) CleanupNode(ctx context.Context) ([]string, error) {
	var out []string
	if b.stagedReady() == nil {
		b.staged.Lock()
		t, err := b.readTunnels(ctx)
		if err == nil && (t.rx != 0 || t.old != 0) {
			out = append(out, "receive ports of "+b.cfg.Interface)
		}
		if err == nil {
			err = b.delReceivers(ctx)
		}
		if err == nil {
			err = b.delOurs(ctx, CookieIn, CookieOut)
		}
		b.staged.Unlock()
		if err != nil {
			return out, fmt.Errorf("cleanup %s: %w", b.cfg.Interface, err)
		}
		out = append(out, fmt.Sprintf("flows with cookies %#x, %#x on %s", CookieIn, CookieOut, b.cfg.Bridge))
	}
	rules, err := b.cfg.Firewall.RemoveKept()
	for _, r := range rules {
		out = append(out, "rule "+r)
	}
	return out, err
}
