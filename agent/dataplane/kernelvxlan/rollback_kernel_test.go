package kernelvxlan

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Privileged: a rolled-back change must leave nothing
// of Cutover's holding the port it was going to: a retry to the same port
// is planned again, and the path check binds that port on every node.

// leftOnPort fails t if node n holds anything of Cutover's after a
// rollback to oldPort from newPort: a VXLAN link other than the device,
// the port held by a socket or a tunnel device, or the underlay address
// not bindable on it (what the path check of a retry does).
func leftOnPort(t *testing.T, n *node, newPort int) {
	t.Helper()
	var extra []string
	for _, l := range strings.Split(strings.TrimSpace(run(t, n.NS, "ip -o link show type vxlan")), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":") != labDev {
			extra = append(extra, l)
		}
	}
	if len(extra) != 0 {
		t.Errorf("%s after the rollback: VXLAN links besides %s left:\n%s", n.NS, labDev, strings.Join(extra, "\n"))
	}
	free, holder, err := n.b.cfg.Ports.Free(uint16(tunnelport.Port(newPort)))
	if err != nil || !free {
		t.Errorf("%s after the rollback: port %d free %v (held by %s), %v", n.NS, newPort, free, holder, err)
	}
	if err := netns.Do(n.NS, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(n.Underlay), Port: newPort})
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		t.Errorf("%s after the rollback: bind %s:%d as the path check does: %v", n.NS, n.Underlay, newPort, err)
	}
	c, err := n.b.Preflight(context.Background(), tunnelport.Port(newPort))
	if err != nil || len(c.Problems) != 0 || !c.TargetFree {
		t.Errorf("%s after the rollback: preflight of a retry to %d: %+v, %v", n.NS, newPort, c, err)
	}
	for _, a := range c.Actions {
		if strings.HasPrefix(a, "remove ") {
			t.Errorf("%s after the rollback: preflight of a retry still finds a leftover: %q", n.NS, a)
		}
	}
}

// TestRollbackFreesTheNewPort: a flipped while b did not (b frozen at the
// commit, say), then both are rolled back as the coordinator does
// (Revert). Neither node may keep a device of Cutover's, up or down, on the
// new port, and the overlay works on the old one.
func TestRollbackFreesTheNewPort(t *testing.T) {
	const oldPort, newPort = 8472, 4889
	ctx := context.Background()
	a, b := newLab(t, oldPort)
	orig := map[*node]string{a: a.text(t), b: b.text(t)}
	snaps := map[*node]dataplane.Snapshot{}
	for _, n := range []*node{a, b} {
		s, err := n.b.Snapshot(ctx, oldPort, newPort)
		if err != nil {
			t.Fatal(err)
		}
		snaps[n] = persist(t, s)
		if err := n.b.Prepare(ctx, snaps[n]); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := a.b.Commit(ctx, snaps[a]); err != nil || st.Port != newPort {
		t.Fatalf("%s commit: %+v, %v", a.NS, st, err)
	}
	for _, n := range []*node{a, b} {
		for rep := 0; rep < 2; rep++ { // a replayed rollback too
			if st, err := n.b.Revert(ctx, snaps[n]); err != nil || st.Port != oldPort {
				t.Fatalf("%s revert %d: %+v, %v", n.NS, rep, st, err)
			}
		}
		if got := n.text(t); got != orig[n] {
			t.Fatalf("%s after revert:\n%s\nwant the original:\n%s", n.NS, got, orig[n])
		}
		leftOnPort(t, n, newPort)
	}
	if got := connectivity(t, a, b, 2*time.Second); got != allPaths {
		t.Fatalf("rolled back to %d: paths %q", oldPort, got)
	}
}

// TestDeadmanFreesTheNewPort: the same through the agent's operation
// machine, reverted by its own dead-man timer (no coordinator), on the
// node that flipped.
func TestDeadmanFreesTheNewPort(t *testing.T) {
	const oldPort, newPort = 8472, 4889
	ctx := context.Background()
	a, _ := newLab(t, oldPort)
	m, err := operation.New(ctx, operation.Options{Backend: a.b, Store: operation.FileStore{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Prepare(ctx, "op-deadman", oldPort, newPort); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Commit(ctx, "op-deadman", time.Time{}, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, _ := m.Status("op-deadman")
		if r.Phase == operation.PhaseReverted {
			break
		}
		if time.Now().After(deadline) || r.Phase == operation.PhaseFailed {
			t.Fatalf("dead-man: record %s (%s), want REVERTED", r.Phase, r.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	leftOnPort(t, a, newPort)
}
