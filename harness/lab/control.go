package lab

// Process and fault control of a running lab, for the fault suite
// (harness/lab/faults) and for anyone reproducing a fault by hand: signal,
// restart, freeze and cut off the real processes, make an agent's state dir
// unwritable, restart a node's ovs-vswitchd. Every action stays inside the
// lab's own namespaces and dirs, and processes are signalled by recorded
// PID (checked against the recorded start time), never by name.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FaultTable is the nftables table Partition adds inside a node's
// namespace. It is an inet-family table of its own, so it never shows up in
// (or changes) the node's iptables-save output, which the fault suite
// compares for orphan rules.
const FaultTable = "cotfault"

// Proc returns the live recorded process of role on node ("hub" for the
// coordinator), the most recently started one when there are several.
func (l *Lab) Proc(role, node string) (Proc, error) {
	ps := l.Procs()
	for i := len(ps) - 1; i >= 0; i-- {
		if p := ps[i]; p.Role == role && p.Node == node && p.Alive() {
			return p, nil
		}
	}
	return Proc{}, fmt.Errorf("lab %q: no running %s on %s: %w", l.Name(), role, node, ErrNotFound)
}

// Signal sends sig to p after checking that p is still the process the lab
// started (same PID and start time).
func Signal(p Proc, sig syscall.Signal) error {
	if !p.Alive() {
		return fmt.Errorf("lab: %s: not running: %w", p, ErrNotFound)
	}
	if err := syscall.Kill(p.PID, sig); err != nil {
		return fmt.Errorf("lab: signal %s to %s: %w", sig, p, err)
	}
	return nil
}

// WaitExit waits until p is gone (reaped, a zombie, or its PID reused).
func WaitExit(p Proc, timeout time.Duration) error {
	if left := waitGone([]Proc{p}, timeout); len(left) > 0 {
		return fmt.Errorf("lab: %s still running after %s", p, timeout)
	}
	return nil
}

// KillAgent sends sig to node's agent; with SIGKILL it also waits until the
// process is gone, so a StartAgent right after cannot race the old one for
// its listening port.
func (l *Lab) KillAgent(node string, sig syscall.Signal) (Proc, error) {
	return l.kill("agent", node, sig)
}

// kill sends sig to the live recorded role on node and, for SIGKILL and
// SIGTERM, waits until it is gone.
func (l *Lab) kill(role, node string, sig syscall.Signal) (Proc, error) {
	p, err := l.Proc(role, node)
	if err != nil {
		return p, err
	}
	if err := Signal(p, sig); err != nil {
		return p, err
	}
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		return p, WaitExit(p, 10*time.Second)
	}
	return p, nil
}

// StartAgent starts node's agent again with the command line Up gave it
// (same state dir, certificates and extra args) plus extra (later flags
// win, e.g. another --tls-cert), records the new PID in lab.json as Up
// does, and waits until it serves /healthz. An agent of the node still
// running is an error: stop it first.
func (l *Lab) StartAgent(ctx context.Context, node string, extra ...string) (Proc, error) {
	n, err := l.Node(node)
	if err != nil {
		return Proc{}, err
	}
	if p, err := l.Proc("agent", node); err == nil {
		return Proc{}, fmt.Errorf("lab: %s is still running; kill it first", p)
	}
	cfg := l.cfg()
	if err := l.spawn("agent", n.Name, n.Netns, filepath.Join(n.Dir, "agent.log"), cfg.AgentBin, append(agentArgs(cfg, n, l.PKIDir()), extra...)...); err != nil {
		return Proc{}, err
	}
	p, err := l.Proc("agent", node)
	if err != nil {
		return p, err
	}
	return p, l.waitHealthy(ctx, p, "http://"+n.Metrics+"/healthz", filepath.Join(n.Dir, "agent.log"))
}

// KillCoordinator sends sig to the lab's coordinator (the most recently
// started one that still runs) and, for SIGKILL and SIGTERM, waits until it
// is gone.
func (l *Lab) KillCoordinator(sig syscall.Signal) (Proc, error) {
	return l.kill("coordinator", "hub", sig)
}

// StartCoordinator starts the coordinator again with Up's command line
// (same journal in <dir>/coordinator, inventory and certificates) and waits
// until it serves /healthz. It does not wait for /readyz: a coordinator
// resuming an interrupted operation is not ready until it has finished or
// undone it, which is what a caller may want to watch.
func (l *Lab) StartCoordinator(ctx context.Context) (Proc, error) {
	if p, err := l.Proc("coordinator", "hub"); err == nil {
		return Proc{}, fmt.Errorf("lab: %s is still running; kill it first", p)
	}
	p, err := l.SpawnCoordinator()
	if err != nil {
		return p, err
	}
	url := "http://" + netip.AddrPortFrom(HubMgmt, CoordinatorMetricsPort).String() + "/healthz"
	return p, l.waitHealthy(ctx, p, url, filepath.Join(l.Dir(), "coordinator.log"))
}

// SpawnCoordinator starts one more coordinator in the hub namespace with
// Up's command line plus extra (later flags win, e.g. another --listen and
// --state-dir for a second coordinator), records it and returns at once.
// It logs to <dir>/coordinator.log like the first.
func (l *Lab) SpawnCoordinator(extra ...string) (Proc, error) {
	cfg := l.cfg()
	inv := filepath.Join(cfg.Dir, "inventory.json")
	args := append(coordinatorArgs(cfg, inv, l.PKIDir()), extra...)
	before := len(l.Procs())
	if err := l.spawn("coordinator", "hub", HubNetns(cfg.Name), filepath.Join(cfg.Dir, "coordinator.log"), cfg.CoordinatorBin, args...); err != nil {
		return Proc{}, err
	}
	ps := l.Procs()
	if len(ps) <= before {
		return Proc{}, errors.New("lab: coordinator started but not recorded")
	}
	return ps[len(ps)-1], nil
}

// waitHealthy polls url (through the hub) until it answers 200, p exits,
// or ReadyTimeout.
func (l *Lab) waitHealthy(ctx context.Context, p Proc, url, log string) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	c := l.hubClient()
	for {
		why := get(ctx, c, url)
		if why == "" {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("lab: %s exited during start-up; see %s", p, log)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lab: %s not healthy (%s: %s); see %s", p, url, why, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Freeze stops p with SIGSTOP: it keeps its sockets and state but answers
// nothing until Thaw. This is how the fault suite holds an agent inside a
// phase (a coordinator stuck waiting for it) or makes it answer late.
func Freeze(p Proc) error { return Signal(p, syscall.SIGSTOP) }

// Thaw resumes a frozen p with SIGCONT.
func Thaw(p Proc) error { return Signal(p, syscall.SIGCONT) }

// Partition cuts node's agent off from the coordinator: inside the node's
// namespace an nftables table (FaultTable) drops TCP to and from the hub's
// management address on the agent's gRPC port. Only that control traffic
// is dropped: the overlay (underlay addresses) and the agent's metrics
// port stay reachable. Established connections stall rather than reset,
// as with a real network partition.
func (l *Lab) Partition(ctx context.Context, node string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	hub := HubMgmt.String()
	port := strconv.Itoa(AgentPort)
	script := fmt.Sprintf(`table inet %[1]s {
	chain in {
		type filter hook input priority -10; policy accept;
		ip saddr %[2]s tcp dport %[3]s drop
	}
	chain out {
		type filter hook output priority -10; policy accept;
		ip daddr %[2]s tcp sport %[3]s drop
	}
}
`, FaultTable, hub, port)
	if _, err := run(ctx, script, "ip", "netns", "exec", n.Netns, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("lab: partition %s: %w", node, err)
	}
	return nil
}

// DropRequests cuts the coordinator's requests to node's agent, one way:
// inside the node's namespace the same FaultTable drops TCP from the hub's
// management address to the agent's gRPC port, while what the agent sends
// (answers to requests it already received) still reaches the coordinator.
// A test that must let an agent answer a queued request yet receive
// nothing new uses it. Heal removes it.
func (l *Lab) DropRequests(ctx context.Context, node string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	script := fmt.Sprintf(`table inet %[1]s {
	chain in {
		type filter hook input priority -10; policy accept;
		ip saddr %[2]s tcp dport %[3]s drop
	}
}
`, FaultTable, HubMgmt.String(), strconv.Itoa(AgentPort))
	if _, err := run(ctx, script, "ip", "netns", "exec", n.Netns, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("lab: drop requests to %s: %w", node, err)
	}
	return nil
}

// AbortDeadCoordinatorConns destroys the hub's TCP connections to the
// agents' port (ss -K) and reports how many there were. Call it once the
// coordinator was killed: its connections live on in the kernel as
// orphans that keep retransmitting what it had queued, and where
// DropRequests held that back, a Heal would deliver the dead coordinator's
// last calls (a Commit) to the agents, after the fact. The sockets are
// aborted (a reset the drop rule keeps from the agents), so nothing of
// theirs is delivered.
func (l *Lab) AbortDeadCoordinatorConns(ctx context.Context) (int, error) {
	out, err := run(ctx, "", "ip", "netns", "exec", HubNetns(l.Name()), "ss", "-K", "-t", "-n", "dport", "=", ":"+strconv.Itoa(AgentPort))
	if err != nil {
		return 0, fmt.Errorf("lab: abort the dead coordinator's connections: %w", err)
	}
	// ss prints a header, then each socket it destroyed.
	return max(0, len(strings.Split(strings.TrimSpace(out), "\n"))-1), nil
}

// Heal removes what Partition or DropRequests added; healing a node not partitioned is not
// an error.
func (l *Lab) Heal(ctx context.Context, node string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	out, err := run(ctx, "", "ip", "netns", "exec", n.Netns, "nft", "list", "tables")
	if err != nil {
		return fmt.Errorf("lab: heal %s: %w", node, err)
	}
	if !slices.Contains(strings.Split(out, "\n"), "table inet "+FaultTable) {
		return nil
	}
	if _, err := run(ctx, "", "ip", "netns", "exec", n.Netns, "nft", "delete", "table", "inet", FaultTable); err != nil {
		return fmt.Errorf("lab: heal %s: %w", node, err)
	}
	return nil
}

// MakeStateDirUnwritable makes every write into node's agent state dir fail,
// even as root, by bind-mounting the dir read-only over itself (root
// ignores file modes, so a chmod would prove nothing; EROFS stops root).
// Reads keep working: the record already there stays visible.
//
// The mount is made inside the running agent's own mount namespace (`ip
// netns exec` gives each agent one, and mounts here are private, so a mount
// in the test's namespace would never reach it), and checked from there: a
// write as root must fail. The returned restore unmounts it again (a no-op
// once that agent is gone: its namespace went with it, and a restarted
// agent starts from a writable copy).
func (l *Lab) MakeStateDirUnwritable(ctx context.Context, node string) (restore func() error, err error) {
	n, err := l.Node(node)
	if err != nil {
		return nil, err
	}
	p, err := l.Proc("agent", node)
	if err != nil {
		return nil, err
	}
	dir := n.StateDir
	inNS := func(argv ...string) (string, error) {
		return run(ctx, "", append([]string{"nsenter", "-t", strconv.Itoa(p.PID), "-m", "--"}, argv...)...)
	}
	if _, err := inNS("mount", "--bind", dir, dir); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if _, err := inNS("mount", "-o", "remount,bind,ro", dir); err != nil {
		_, _ = inNS("umount", "-l", dir)
		return nil, fmt.Errorf("lab: %w", err)
	}
	probe := filepath.Join(dir, ".unwritable-probe")
	if _, err := inNS("touch", probe); err == nil {
		_, _ = inNS("rm", "-f", probe)
		_, _ = inNS("umount", "-l", dir)
		return nil, fmt.Errorf("lab: %s still writable for %s after a read-only bind mount", dir, p)
	}
	done := false
	return func() error {
		if done || !p.Alive() {
			return nil
		}
		if _, err := inNS("umount", dir); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		done = true
		return nil
	}, nil
}

// RestartVswitchd stops node's ovs-vswitchd by PID and starts it again on
// the same database, records the new PID, then puts back what the lab
// configured outside OVSDB and a vswitchd restart loses, as the CNI does
// on a real node: the addresses of the userspace internal ports (br-ul,
// br0), the userspace tunnel route and br0's flows. The VXLAN port, which
// lives in OVSDB, is whatever the database says. It needs a lab started by
// this process (Up, not Load): only that one owns the OVS daemons.
func (l *Lab) RestartVswitchd(ctx context.Context, node string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	inst := l.OVS(node)
	if inst == nil {
		return fmt.Errorf("lab: node %s has no Open vSwitch (backend %s)", node, l.cfg().Backend)
	}
	if inst.VswitchdPID() == 0 {
		return fmt.Errorf("lab: node %s: ovs-vswitchd is not owned by this process (lab loaded from %s?)", node, l.Dir())
	}
	if err := inst.RestartVswitchd(ctx); err != nil {
		return fmt.Errorf("lab: node %s: %w", node, err)
	}
	p, err := newProc("ovs-vswitchd", n.Name, inst.VswitchdPID())
	if err == nil {
		err = l.addProc(p)
	}
	if err != nil {
		return err
	}
	// The internal ports are new tap devices: addresses and state again.
	// "addr add" of an address still there fails; replace is idempotent.
	var lines []string
	for _, s := range ovsNodeLines(n) {
		if rest, ok := strings.CutPrefix(s, "addr add "); ok {
			s = "addr replace " + rest
		}
		lines = append(lines, s)
	}
	if err := ipBatch(ctx, n.Netns, lines); err != nil {
		return fmt.Errorf("lab: node %s after vswitchd restart: %w", node, err)
	}
	if err := addTunnelRoute(ctx, inst); err != nil {
		return fmt.Errorf("lab: node %s after vswitchd restart: %w", node, err)
	}
	flows := filepath.Join(n.Dir, "br0.flows")
	if _, err := inst.Ofctl(ctx, "-O", "OpenFlow13", "replace-flows", "br0", flows); err != nil {
		return fmt.Errorf("lab: node %s after vswitchd restart: %w", node, err)
	}
	if err := sendGARP(ctx, inst, n); err != nil {
		return fmt.Errorf("lab: node %s after vswitchd restart: gratuitous ARP: %w", node, err)
	}
	return nil
}
