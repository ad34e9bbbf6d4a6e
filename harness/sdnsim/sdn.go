package sdnsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Exit codes of the stand-in process.
const (
	ExitOK          = 0 // stopped by a signal
	ExitSetup       = 1 // could not read its configuration or set the node up
	ExitHealthCheck = 2 // the health check found OVS not as it set it up
)

// Version note of the flow rules, table 253: "<plugin id>.<rule version>"
// as openshift-sdn writes it (plugin 0 = subnet, rule version 11).
const (
	VersionTable = 253
	VersionNote  = "00.0b"
)

// DefaultHealthInterval is openshift-sdn's health-check interval.
const DefaultHealthInterval = 30 * time.Second

// PortSource is where the SDN reads the VXLAN port at start.
type PortSource interface {
	VXLANPort(ctx context.Context) (uint16, error)
}

// Node is what the SDN does to its node. OVSNode is the real one, Fake the
// in-memory one.
type Node interface {
	// DstPort reads Interface vxlan0 options:dst_port (4789 when unset).
	DstPort(ctx context.Context) (uint16, error)
	// VersionFlows returns the actions of every flow in table 253.
	VersionFlows(ctx context.Context) ([]string, error)
	// Rebuild deletes br0 and builds it again on port with the pods
	// re-attached and the drop flow for port, but without the version note.
	Rebuild(ctx context.Context, port uint16) error
	// FinishSetup writes the version note.
	FinishSetup(ctx context.Context, note string) error
	// SyncFirewall makes the SDN's chains hold its rules for port.
	SyncFirewall(ctx context.Context, port uint16) error
	// Lost is closed when the connection to OVSDB is lost; Reconnect
	// makes a new one (and a new Lost channel).
	Lost() <-chan struct{}
	Reconnect(ctx context.Context) error
}

// Config is one stand-in.
type Config struct {
	NodeName string
	Source   PortSource
	Node     Node
	// HealthInterval is how often AlreadySetUp is checked (and the
	// firewall re-synced).
	HealthInterval time.Duration
	// NoHealthCheck is the field report's patched image: the check still
	// runs and is reported, but a failure no longer makes the SDN exit.
	NoHealthCheck bool
	// Events receives one line per event ("start port=4789 setup=rebuilt",
	// "ready", "health ok", "health failed ...", "exit ..."); the
	// supervisor reads them from the process's stdout.
	Events io.Writer
	// Now is the clock (tests).
	Now func() time.Time
}

// HealthError is a failed health check: the SDN exits with it.
type HealthError struct{ Reason string }

func (e *HealthError) Error() string {
	return "SDN healthcheck detected unhealthy OVS server: " + e.Reason
}

// IsHealth reports whether err is a failed health check.
func IsHealth(err error) bool {
	var h *HealthError
	return errors.As(err, &h)
}

func (c Config) event(format string, args ...any) {
	if c.Events != nil {
		_, _ = fmt.Fprintf(c.Events, "EVENT "+format+"\n", args...)
	}
}

// AlreadySetUp is openshift-sdn's check; the reason says what failed.
func AlreadySetUp(ctx context.Context, n Node, port uint16) (ok bool, reason string) {
	flows, err := n.VersionFlows(ctx)
	if err != nil {
		return false, fmt.Sprintf("dump table %d: %v", VersionTable, err)
	}
	if len(flows) != 1 {
		return false, fmt.Sprintf("table %d holds %d flows, want the version note alone", VersionTable, len(flows))
	}
	got, err := n.DstPort(ctx)
	if err != nil {
		return false, fmt.Sprintf("read vxlan0 dst_port: %v", err)
	}
	if got != port {
		return false, fmt.Sprintf("vxlan0 options:dst_port is %d, the ClusterNetwork said %d", got, port)
	}
	if !strings.HasPrefix(strings.ToLower(flows[0]), "note:"+VersionNote) {
		return false, fmt.Sprintf("version note is %q, want note:%s", flows[0], VersionNote)
	}
	return true, ""
}

// Run is the SDN's life: read the port, set the node up (rebuilding br0
// unless it is already set up for that port), then check every interval
// and after every OVSDB reconnect. It returns nil when ctx ends, a
// *HealthError when the health check fails, any other error when setup
// failed.
func Run(ctx context.Context, c Config) error {
	if c.HealthInterval <= 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	port, err := c.Source.VXLANPort(ctx)
	if err != nil {
		return fmt.Errorf("read the VXLAN port: %w", err)
	}
	setup := "already"
	if ok, reason := AlreadySetUp(ctx, c.Node, port); !ok {
		setup = "rebuilt"
		c.event("rebuild port=%d reason=%q", port, reason)
		if err := c.Node.Rebuild(ctx, port); err != nil {
			return fmt.Errorf("rebuild br0 on port %d: %w", port, err)
		}
		if err := c.Node.FinishSetup(ctx, VersionNote); err != nil {
			return fmt.Errorf("write the version note: %w", err)
		}
	}
	if err := c.Node.SyncFirewall(ctx, port); err != nil {
		return fmt.Errorf("sync iptables for port %d: %w", port, err)
	}
	c.event("start port=%d setup=%s healthcheck=%t", port, setup, !c.NoHealthCheck)
	c.event("ready")
	t := time.NewTicker(c.HealthInterval)
	defer t.Stop()
	for {
		var why string
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			why = "interval"
		case <-c.Node.Lost():
			// openshift-sdn re-checks when its OVS connection comes back
			// (ovs-vswitchd or ovsdb-server restarted).
			for {
				if err := c.Node.Reconnect(ctx); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
			}
			why = "reconnect"
		}
		ok, reason := AlreadySetUp(ctx, c.Node, port)
		switch {
		case ok:
			c.event("health ok on=%s", why)
		case c.NoHealthCheck:
			c.event("health failed-ignored on=%s reason=%q", why, reason)
		default:
			c.event("health failed on=%s reason=%q", why, reason)
			return &HealthError{Reason: reason}
		}
		if err := c.Node.SyncFirewall(ctx, port); err != nil && ctx.Err() == nil {
			c.event("iptables sync failed err=%q", err.Error())
		}
	}
}
