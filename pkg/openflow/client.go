package openflow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Interface is what the agent does to a bridge's flow table. Client is the
// real one, Fake the in-memory one.
type Interface interface {
	// AddFlow adds f, or replaces the flow with the same table, priority
	// and match (OpenFlow add semantics).
	AddFlow(ctx context.Context, bridge string, f Flow) error
	// DelFlows deletes, in match.Table, every flow whose match is at least
	// as specific as match.Match (non-strict; priority is ignored; a
	// nonzero Cookie must also be equal). An empty match is refused.
	DelFlows(ctx context.Context, bridge string, match Flow) error
	// DelFlowStrict deletes the one flow with exactly f's table, priority
	// and match.
	DelFlowStrict(ctx context.Context, bridge string, f Flow) error
	// DumpFlows returns every flow on the bridge.
	DumpFlows(ctx context.Context, bridge string) ([]Flow, error)
	// AddFlows adds (or replaces, as AddFlow) every flow in one
	// request: one ovs-ofctl run however many flows, which matters where
	// a node's CPU also runs its userspace datapath.
	AddFlows(ctx context.Context, bridge string, flows []Flow) error
}

// Client drives ovs-ofctl. Every method builds an argv and goes through
// Exec, so the code a unit test covers with a fake seam is the code that
// runs in production.
type Client struct {
	Exec execseam.Func // nil: execseam.Exec
	// RunDir is OVS_RUNDIR, where ovs-vswitchd's <bridge>.mgmt socket lives;
	// empty: ovs-ofctl's default (/var/run/openvswitch).
	RunDir string
	// Netns, when set, runs ovs-ofctl with `ip netns exec Netns`. The
	// management socket is a file, so this is rarely needed.
	Netns string
	// Timeout bounds each ovs-ofctl run (--timeout), so a hung ovs-vswitchd
	// cannot hang the agent; 0 means 10s.
	Timeout time.Duration
}

var _ Interface = (*Client)(nil)

// ErrBridgeNotFound marks a bridge ovs-vswitchd does not have (no
// <bridge>.mgmt socket, or "is not a bridge"). Test with IsNotFound.
var ErrBridgeNotFound = errors.New("no such bridge")

// IsNotFound reports whether err says the bridge does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrBridgeNotFound) }

var bridgeRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

func validBridge(b string) error {
	if !bridgeRE.MatchString(b) {
		return &ValidationError{"bridge", b, "must be 1-15 characters of letters, digits, '_', '.', '-' (a Linux interface name)"}
	}
	return nil
}

func (c *Client) run(ctx context.Context, args ...string) ([]byte, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	argv := []string{"ovs-ofctl", "-O", "OpenFlow13", "--timeout=" + strconv.Itoa(int((timeout+time.Second-1)/time.Second))}
	argv = append(argv, args...)
	if c.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", c.Netns}, argv...)
	}
	var env []string
	if c.RunDir != "" {
		env = []string{"OVS_RUNDIR=" + c.RunDir}
	}
	run := c.Exec
	if run == nil {
		run = execseam.Exec
	}
	out, err := run(ctx, argv, env)
	if err != nil {
		o := string(out)
		var ee *execseam.Error
		if !errors.As(err, &ee) {
			ee = &execseam.Error{Argv: argv, Output: o, Err: err} // a seam that is not execseam.Exec
		}
		if strings.Contains(o, "is not a bridge") || strings.Contains(o, ".mgmt: No such file") ||
			strings.Contains(o, ".mgmt: Connection refused") {
			ee = &execseam.Error{Argv: ee.Argv, Output: ee.Output, Err: fmt.Errorf("%w: %w", ErrBridgeNotFound, ee.Err)}
		}
		return out, fmt.Errorf("openflow: %w", ee)
	}
	return out, nil
}

// AddFlow runs ovs-ofctl add-flow.
func (c *Client) AddFlow(ctx context.Context, bridge string, f Flow) error {
	if err := validBridge(bridge); err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return err
	}
	_, err := c.run(ctx, "add-flow", bridge, f.String())
	return err
}

// AddFlows runs ovs-ofctl add-flows with the flows in a file.
func (c *Client) AddFlows(ctx context.Context, bridge string, flows []Flow) error {
	if err := validBridge(bridge); err != nil {
		return err
	}
	if len(flows) == 0 {
		return nil
	}
	var b strings.Builder
	for _, f := range flows {
		if err := f.Validate(); err != nil {
			return err
		}
		b.WriteString(f.String() + "\n")
	}
	tmp, err := os.CreateTemp("", "cutover-flows-*")
	if err != nil {
		return fmt.Errorf("openflow: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.WriteString(b.String()); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("openflow: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("openflow: %w", err)
	}
	_, err = c.run(ctx, "add-flows", bridge, tmp.Name())
	return err
}

// delMatch is the match text of a delete: table, cookie with an exact mask
// (ovs-ofctl refuses an unmasked cookie on delete), the match fields, and
// the priority only for --strict (non-strict delete rejects it).
func delMatch(f Flow, strict bool) string {
	parts := []string{"table=" + strconv.Itoa(int(f.Table))}
	if strict {
		parts = append(parts, "priority="+strconv.Itoa(int(f.Priority)))
	}
	if f.Cookie != 0 {
		parts = append(parts, fmt.Sprintf("cookie=%#x/-1", f.Cookie))
	}
	if m := f.MatchString(); m != "" {
		parts = append(parts, m)
	}
	return strings.Join(parts, ",")
}

func validDelete(bridge string, f Flow) error {
	if err := validBridge(bridge); err != nil {
		return err
	}
	// Actions do not matter to a delete; validate the rest.
	f.Actions = "drop"
	if err := f.Validate(); err != nil {
		return err
	}
	// An empty match with a cookie deletes only that cookie's flows.
	if len(f.Match) == 0 && f.Cookie == 0 {
		return &ValidationError{"match", "", fmt.Sprintf("is empty: would delete every flow in table %d; refused (give a match or a cookie)", f.Table)}
	}
	return nil
}

// DelFlows runs ovs-ofctl del-flows (non-strict).
func (c *Client) DelFlows(ctx context.Context, bridge string, match Flow) error {
	if err := validDelete(bridge, match); err != nil {
		return err
	}
	_, err := c.run(ctx, "del-flows", bridge, delMatch(match, false))
	return err
}

// DelFlowStrict runs ovs-ofctl --strict del-flows.
func (c *Client) DelFlowStrict(ctx context.Context, bridge string, f Flow) error {
	if err := validDelete(bridge, f); err != nil {
		return err
	}
	_, err := c.run(ctx, "--strict", "del-flows", bridge, delMatch(f, true))
	return err
}

// DumpFlows runs ovs-ofctl dump-flows and parses every flow line.
func (c *Client) DumpFlows(ctx context.Context, bridge string) ([]Flow, error) {
	if err := validBridge(bridge); err != nil {
		return nil, err
	}
	argv := []string{"--no-names", "dump-flows", bridge}
	out, err := c.run(ctx, argv...)
	if err != nil {
		return nil, err
	}
	flows, err := ParseDump(string(out))
	if err != nil {
		return nil, fmt.Errorf("openflow: ovs-ofctl dump-flows %s: %w", bridge, err)
	}
	return flows, nil
}

// ParseDump parses `ovs-ofctl dump-flows` output, skipping the reply
// headers ("OFPST_FLOW reply (OF1.3) (xid=0x2):") and blank lines.
func ParseDump(out string) ([]Flow, error) {
	var flows []Flow
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "OFPST_") || strings.HasPrefix(t, "NXST_") || strings.HasPrefix(t, "OFPT_") {
			continue
		}
		f, err := ParseFlow(t)
		if err != nil {
			return nil, err
		}
		flows = append(flows, f)
	}
	return flows, nil
}
