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
	"strconv"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

// Config wires the backend to its drivers.
type Config struct {
	OVS       ovs.Driver
	Interface string // the VXLAN interface, "vxlan0"
	Firewall  *dataplane.Firewall
	Ports     udpport.Checker // nil: no port-free check
	// Flows, when set, are OpenFlow flows that carry the port (the
	// openshift-sdn profile's drop flow, sdn.go): opened, closed and
	// reported like the firewall rules.
	Flows *PortFlows
}

// Backend implements dataplane.Backend over OVS.
type Backend struct{ cfg Config }

var _ dataplane.Backend = (*Backend)(nil)

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
	iface, err := b.cfg.OVS.GetInterface(ctx, b.cfg.Interface)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("read interface %s: %w", b.cfg.Interface, err)
	}
	return b.state(iface)
}

func (b *Backend) state(iface ovs.Interface) (dataplane.State, error) {
	port, err := iface.DstPort()
	if err != nil {
		return dataplane.State{}, fmt.Errorf("interface %s: %w", b.cfg.Interface, err)
	}
	d := map[string]string{"type": iface.Type, "ofport": strconv.FormatInt(iface.OFPort, 10)}
	if iface.Error != "" {
		d["error"] = iface.Error
	}
	return dataplane.State{Backend: b.Name(), Device: b.cfg.Interface, Port: port, Detail: d}, nil
}

// Preflight implements dataplane.Backend.
func (b *Backend) Preflight(ctx context.Context, to uint16) (dataplane.Check, error) {
	var c dataplane.Check
	iface, err := b.cfg.OVS.GetInterface(ctx, b.cfg.Interface)
	if err != nil {
		c.Problems = append(c.Problems, fmt.Sprintf("OVS interface %s: %v", b.cfg.Interface, err))
		return c, nil
	}
	st, err := b.state(iface)
	if err != nil {
		c.Problems = append(c.Problems, err.Error())
		return c, nil
	}
	c.CurrentPort = st.Port
	if iface.Type != "vxlan" {
		c.Problems = append(c.Problems, fmt.Sprintf("OVS interface %s is of type %q, not vxlan", b.cfg.Interface, iface.Type))
	}
	if iface.OFPort < 1 || iface.Error != "" {
		c.Problems = append(c.Problems, fmt.Sprintf("OVS interface %s is failed already (ofport %d, error %q): fix it before a cutover", b.cfg.Interface, iface.OFPort, iface.Error))
	}
	if to == st.Port {
		c.Problems = append(c.Problems, fmt.Sprintf("port %d: the interface already uses it", to))
	}
	c.TargetFree = true
	if b.cfg.Ports != nil {
		free, holder, err := b.cfg.Ports.Free(to)
		switch {
		case err != nil:
			c.Problems = append(c.Problems, fmt.Sprintf("port %d: cannot tell whether it is free: %v", to, err))
		case !free:
			c.TargetFree = false
			c.TargetHolder = holder.String()
			c.Problems = append(c.Problems, fmt.Sprintf("port %d is in use on this node by %s", to, holder))
		}
	}
	c.Problems = append(c.Problems, b.cfg.Firewall.Problems()...)
	if b.cfg.Flows != nil {
		// A profile is on: say what of the CNI's it found.
		found, problems := b.found(ctx, st.Port)
		c.Actions = append(c.Actions, found...)
		c.Problems = append(c.Problems, problems...)
	}
	open, closeOld := b.cfg.Firewall.Actions(st.Port, to)
	flowsOpen, flowsClose := b.cfg.Flows.Actions(st.Port, to)
	open, closeOld = append(open, flowsOpen...), append(closeOld, flowsClose...)
	c.Actions = append(c.Actions, open...)
	c.Actions = append(c.Actions, fmt.Sprintf("ovsdb transact: wait Interface %s options:dst_port=%d, update options:dst_port=%d, next_cfg+1; wait cur_cfg; read back ofport/error", b.cfg.Interface, st.Port, to))
	c.Actions = append(c.Actions, closeOld...)
	return c, nil
}

// Snapshot implements dataplane.Backend.
func (b *Backend) Snapshot(ctx context.Context, from, to uint16) (dataplane.Snapshot, error) {
	iface, err := b.cfg.OVS.GetInterface(ctx, b.cfg.Interface)
	if err != nil {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: %w", b.cfg.Interface, err)
	}
	st, err := b.state(iface)
	if err != nil {
		return dataplane.Snapshot{}, err
	}
	if st.Port != from {
		return dataplane.Snapshot{}, fmt.Errorf("snapshot %s: current port is %d, not %d", b.cfg.Interface, st.Port, from)
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
		return sd, fmt.Errorf("snapshot is for backend %q, not ovs", s.Backend)
	}
	if len(s.Data) > 0 {
		if err := json.Unmarshal(s.Data, &sd); err != nil {
			return sd, fmt.Errorf("snapshot data: %w", err)
		}
	}
	return sd, nil
}

// Prepare implements dataplane.Backend: the target port is opened; OVS is
// not touched.
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
		return b.cfg.Flows.Add(ctx, s.ToPort)
	}
	return nil
}

// Commit implements dataplane.Backend: one compare-and-set transaction,
// confirmed by ovs-vswitchd (cur_cfg) and read back.
func (b *Backend) Commit(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
	iface, err := b.cfg.OVS.SetDstPort(ctx, b.cfg.Interface, s.FromPort, s.ToPort)
	if err != nil {
		return dataplane.State{}, fmt.Errorf("commit %s %d→%d: %w", b.cfg.Interface, s.FromPort, s.ToPort, err)
	}
	return b.state(iface)
}

// Revert implements dataplane.Backend.
func (b *Backend) Revert(ctx context.Context, s dataplane.Snapshot) (dataplane.State, error) {
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
		iface, err := b.cfg.OVS.SetDstPort(ctx, b.cfg.Interface, s.ToPort, s.FromPort)
		if err != nil {
			return dataplane.State{}, fmt.Errorf("revert %s %d→%d: %w", b.cfg.Interface, s.ToPort, s.FromPort, err)
		}
		if st, err = b.state(iface); err != nil {
			return dataplane.State{}, err
		}
	default:
		return st, fmt.Errorf("revert %s: current port %d is neither %d nor %d: something else changed it; not touching it", b.cfg.Interface, st.Port, s.FromPort, s.ToPort)
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

// Finalize implements dataplane.Backend: the old port's rules go.
func (b *Backend) Finalize(ctx context.Context, s dataplane.Snapshot) error {
	if _, err := decode(s); err != nil {
		return err
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
	if _, err := b.cfg.OVS.GetInterface(ctx, b.cfg.Interface); err != nil {
		out = append(out, fmt.Sprintf("ovs interface %s: %v", b.cfg.Interface, err))
	}
	return append(out, b.cfg.Firewall.Problems()...)
}
