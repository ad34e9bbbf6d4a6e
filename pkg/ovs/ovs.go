// Package ovs is the agent's Open vSwitch driver: it reads an Interface and
// moves a tunnel interface's UDP port (options:dst_port) with one
// compare-and-set OVSDB transaction, then waits for ovs-vswitchd to apply it
// and reads the result back. For the staged strategy it also adds and
// removes ports of one interface on a bridge (the receive ports), together
// with such moves, in one transaction that ovs-vswitchd applies as a whole.
//
// It owns only the Interface and Port rows it is asked about (and
// Open_vSwitch next_cfg, to make ovs-vswitchd reconfigure). It must not
// create or delete bridges or flows, and it never retries a write: a
// refused compare-and-set means another controller changed the interface,
// and the caller decides what to do.
//
// Driver is the seam: Client speaks OVSDB (pkg/ovsdb) to a real
// ovsdb-server, Fake keeps the same rules in memory and dumps its state as
// text. Both decide through planDstPort, so the fake covers the real logic.
package ovs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Interface is the part of an OVSDB Interface row the driver deals in.
type Interface struct {
	Name    string
	Type    string
	Options map[string]string
	OFPort  int64  // -1: ovs-vswitchd failed the interface; 0: not (yet) assigned
	Error   string // ovs-vswitchd's reason when it failed the interface
	// OFPortRequest is the OpenFlow port number asked for (0: none), which
	// ovs-vswitchd gives the interface when no other has it.
	OFPortRequest int64
	// MTURequest is the MTU asked for (0: none). An internal interface
	// without one gets its MTU recomputed whenever a port joins or leaves
	// its bridge.
	MTURequest int64
}

// Default UDP ports of OVS tunnel types when options:dst_port is absent.
var defaultDstPort = map[string]uint16{"vxlan": 4789, "geneve": 6081, "stt": 7471}

// DstPort is the interface's effective UDP destination port: options:dst_port,
// or the OVS default for its type when absent (4789 for vxlan).
func (i Interface) DstPort() (uint16, error) {
	s, ok := i.Options["dst_port"]
	if !ok {
		if p, ok := defaultDstPort[i.Type]; ok {
			return p, nil
		}
		return 0, fmt.Errorf("interface %s: type %q has no options:dst_port and no default UDP port", i.Name, i.Type)
	}
	// ovs-vswitchd itself accepts any atoi() value and wraps it into 16
	// bits (dst_port=-5 becomes 65531): refuse what is not a real port.
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("interface %s: options:dst_port=%q: not a UDP port in 1..65535", i.Name, s)
	}
	return uint16(n), nil
}

// Healthy reports whether ovs-vswitchd runs the interface: an OpenFlow port
// number assigned and no error.
func (i Interface) Healthy() bool { return i.OFPort > 0 && i.Error == "" }

// String renders the interface as one canonical line (sorted options), the
// format of Fake.Dump.
func (i Interface) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s type=%s ofport=%d", i.Name, i.Type, i.OFPort)
	if i.OFPortRequest != 0 {
		fmt.Fprintf(&b, " ofport_request=%d", i.OFPortRequest)
	}
	if i.MTURequest != 0 {
		fmt.Fprintf(&b, " mtu_request=%d", i.MTURequest)
	}
	for _, k := range sortedKeys(i.Options) {
		fmt.Fprintf(&b, " options:%s=%s", k, i.Options[k])
	}
	if i.Error != "" {
		fmt.Fprintf(&b, " error=%q", i.Error)
	}
	return b.String()
}

// Driver is what the agent needs from Open vSwitch.
type Driver interface {
	// Ping checks that the database answers (OVSDB echo).
	Ping(ctx context.Context) error
	// GetInterface reads an interface; a missing one is a *NotFoundError.
	GetInterface(ctx context.Context, name string) (Interface, error)
	// SetDstPort moves the interface's UDP port from from to to, if and
	// only if it is at from now (compare-and-set), keeping its other
	// options; it returns once ovs-vswitchd applied the change, with the
	// interface as read back. A replay (already at to) succeeds without a
	// write. Errors: *NotFoundError, *ConflictError (not at from, or
	// changed concurrently), *PortError (ovs-vswitchd failed the port, or
	// the change would duplicate another tunnel's configuration),
	// *NotAppliedError (committed but not applied in time).
	SetDstPort(ctx context.Context, name string, from, to uint16) (Interface, error)
	// PrepareDstPort does everything SetDstPort does before its write (the
	// read, the checks, the transaction built, the cur_cfg watch open), so
	// that at the instant Apply sends one message. It writes nothing. The
	// errors are SetDstPort's; on error, Current still tells what was read.
	PrepareDstPort(ctx context.Context, name string, from, to uint16) (PreparedChange, error)
	// Interfaces reads the interfaces of bridge's ports (the bridge's own
	// internal one included), sorted by name; a missing bridge is a
	// *NotFoundError.
	Interfaces(ctx context.Context, bridge string) ([]Interface, error)
	// ChangePorts applies c as one transaction, which ovs-vswitchd applies
	// as a whole, and returns once it has (cur_cfg). Nothing to do writes
	// nothing, but still waits for a change pending in ovs-vswitchd.
	// Errors: *NotFoundError (the bridge, an interface to move),
	// *ConflictError (a move's interface not at From, or changed
	// concurrently: nothing was written), *NotAppliedError.
	ChangePorts(ctx context.Context, c PortsChange) error
}

// PortsChange is one transaction on a bridge's ports. Its parts apply
// together or not at all: the staged strategy's switch adds a receive port
// and moves vxlan0 in one, so that no instant has the old port unheard.
type PortsChange struct {
	Bridge string
	// Add are ports of one interface each, named as the interface, with
	// its Type, Options and OFPortRequest. A port of that name on the
	// bridge already stays, and its interface gets them (a replay).
	Add []Interface
	// Move are dst_port moves, each a compare-and-set as SetDstPort's; one
	// already at To is nothing to do.
	Move []Move
	// Del are ports removed from the bridge, with their interfaces; an
	// absent one is nothing to do.
	Del []string
}

// Move is an interface's options:dst_port moving From -> To.
type Move struct {
	Name     string
	From, To uint16
}

// String renders the change for a transaction comment and errors.
func (c PortsChange) String() string {
	var parts []string
	for _, a := range c.Add {
		parts = append(parts, "add "+a.Name)
	}
	for _, m := range c.Move {
		parts = append(parts, fmt.Sprintf("%s dst_port %d -> %d", m.Name, m.From, m.To))
	}
	for _, d := range c.Del {
		parts = append(parts, "del "+d)
	}
	return c.Bridge + ": " + strings.Join(parts, ", ")
}

// PreparedChange is a dst_port change built ahead of its instant. It is used
// by one goroutine.
type PreparedChange interface {
	// Apply sends the prepared write and returns as SetDstPort does. The
	// write is a compare-and-set against the interface as read at Prepare:
	// if the row changed since, it is a *ConflictError and nothing is
	// written. Apply runs at most once.
	Apply(ctx context.Context) (Interface, error)
	// Current is the interface as read at Prepare.
	Current() Interface
	// Timing is when Apply's write left and when ovs-vswitchd confirmed
	// it (cur_cfg); zero before Apply, confirmed zero if it did not, and
	// both zero for a no-op (already on the port: nothing was written).
	Timing() (sent, confirmed time.Time)
	// Close releases the watch; safe to call more than once, and after Apply.
	Close()
}

// NotFoundError is an interface (or, Kind "bridge", a bridge) that does
// not exist.
type NotFoundError struct {
	Name string
	Kind string // "" for an interface
}

func (e *NotFoundError) Error() string {
	kind := e.Kind
	if kind == "" {
		kind = "interface"
	}
	return fmt.Sprintf("ovs: %s %q not found", kind, e.Name)
}

// ConflictError is a compare-and-set that found the interface not as
// expected: another controller changed it (or the caller's view is stale).
// Nothing was changed.
type ConflictError struct {
	Name     string
	Expected uint16 // the port the caller expected (from)
	Current  string // what the interface holds now, e.g. "dst_port=4999", "deleted"
	Err      error  // the underlying OVSDB error, if any
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("ovs: interface %s: compare-and-set refused: expected dst_port=%d, found %s; another controller changed it, nothing was written",
		e.Name, e.Expected, e.Current)
}

func (e *ConflictError) Unwrap() error { return e.Err }

// PortError is an interface ovs-vswitchd could not run (ofport -1 and an
// error string), or a change refused because it would give two tunnels the
// same configuration.
type PortError struct {
	Iface   Interface
	Reason  string
	Applied bool  // whether the change is in the database
	Err     error // the underlying OVSDB error, if any
}

func (e *PortError) Unwrap() error { return e.Err }

func (e *PortError) Error() string {
	state := "the change is in the database"
	if !e.Applied {
		state = "nothing was written"
	}
	return fmt.Sprintf("ovs: interface %s: %s (%s)", e.Iface.Name, e.Reason, state)
}

// NotAppliedError is a change committed to the database that ovs-vswitchd
// did not report applied (cur_cfg) in time: the database holds the new
// port, the datapath may not.
type NotAppliedError struct {
	Name string
	// What is the change when it is not Name's dst_port alone (a
	// PortsChange, as its String).
	What            string
	NextCfg, CurCfg int64
	Err             error
}

func (e *NotAppliedError) Error() string {
	what := "interface " + e.Name
	if e.What != "" {
		what = e.What
	}
	return fmt.Sprintf("ovs: %s: change committed (next_cfg %d) but ovs-vswitchd has not applied it (cur_cfg %d): %v; is ovs-vswitchd running?",
		what, e.NextCfg, e.CurCfg, e.Err)
}

func (e *NotAppliedError) Unwrap() error { return e.Err }

// IsNotFound reports a missing interface.
func IsNotFound(err error) bool { var e *NotFoundError; return errors.As(err, &e) }

// IsConflict reports a refused compare-and-set.
func IsConflict(err error) bool { var e *ConflictError; return errors.As(err, &e) }

// IsPortError reports an interface ovs-vswitchd failed or a refused duplicate.
func IsPortError(err error) bool { var e *PortError; return errors.As(err, &e) }

// IsNotApplied reports a committed change ovs-vswitchd did not apply in time.
func IsNotApplied(err error) bool { var e *NotAppliedError; return errors.As(err, &e) }

// planDstPort decides what SetDstPort does to cur: nothing (noop, a replay
// or from==to), or write options. It is shared by Client and Fake.
func planDstPort(cur Interface, from, to uint16) (options map[string]string, noop bool, err error) {
	if from == 0 {
		return nil, false, fmt.Errorf("ovs: SetDstPort %s: from=0: not a UDP port (want 1..65535)", cur.Name)
	}
	if to == 0 {
		return nil, false, fmt.Errorf("ovs: SetDstPort %s: to=0: not a UDP port (want 1..65535)", cur.Name)
	}
	if _, ok := defaultDstPort[cur.Type]; !ok {
		return nil, false, fmt.Errorf("ovs: SetDstPort %s: interface type %q is not a UDP tunnel (want vxlan, geneve or stt)", cur.Name, cur.Type)
	}
	port, err := cur.DstPort()
	if err != nil {
		return nil, false, &ConflictError{Name: cur.Name, Expected: from, Current: fmt.Sprintf("options:dst_port=%q", cur.Options["dst_port"]), Err: err}
	}
	if port == to {
		return nil, true, nil
	}
	if port != from {
		return nil, false, &ConflictError{Name: cur.Name, Expected: from, Current: "dst_port=" + strconv.Itoa(int(port))}
	}
	options = make(map[string]string, len(cur.Options)+1)
	for k, v := range cur.Options {
		options[k] = v
	}
	options["dst_port"] = strconv.Itoa(int(to))
	return options, false, nil
}

// sameTunnel reports whether two interfaces would have one tunnel
// configuration: ovs-vswitchd's userspace datapath accepts that with only a
// log warning ("attempting to add tunnel port with same config") and then
// delivers packets to one of them, so the driver refuses it itself.
func sameTunnel(a, b Interface) bool {
	if a.Type != b.Type || len(a.Options) != len(b.Options) {
		return false
	}
	for k, v := range a.Options {
		if bv, ok := b.Options[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func portFailure(iface Interface) error {
	if iface.Healthy() {
		return nil
	}
	reason := fmt.Sprintf("ovs-vswitchd failed the interface: ofport %d", iface.OFPort)
	if iface.Error != "" {
		reason += ", error " + strconv.Quote(iface.Error)
	}
	return &PortError{Iface: iface, Reason: reason, Applied: true}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// optionsString renders options as ovs-vsctl does: {k=v, k=v}.
func optionsString(o map[string]string) string {
	parts := make([]string, 0, len(o))
	for _, k := range sortedKeys(o) {
		parts = append(parts, k+"="+o[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
