package agent

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/dataplane/kernelvxlan"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/harness/nsiptables"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// TestCleanupLeavesNothing (uninstall leaves nothing behind): on a real kernel VXLAN
// node (fresh namespaces, real iptables), a snapshot of links and
// iptables-save is taken before Cutover first runs; then the agent's keeper
// opens the port with its marked rule, an operation is prepared (cleanup
// refuses, naming it, and changes nothing), rolled back, and a device of
// Cutover's is left as a crash would leave it. Cleanup must then leave the
// links and the firewall exactly as the snapshot, and no state directory;
// an operator's rule stays.
func TestCleanupLeavesNothing(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "bridge", "iptables", "iptables-save", "sysctl")
	ctx := context.Background()
	a, _ := vxlantest.New(t, vxlantest.Config{Prefix: "cot-cln", Device: "flannel.1", VNI: 1, Port: 8472, PinToVeth: true, MTU: 1450, NoIPv6: true})
	run := func(cmd string) string { return vxlantest.Run(t, a.NS, cmd) }
	run("iptables -N OS_FIREWALL_ALLOW")
	run("iptables -A INPUT -j OS_FIREWALL_ALLOW")
	run("iptables -A OS_FIREWALL_ALLOW -p udp -m udp --dport 5555 -m comment --comment operator -j ACCEPT")
	var c *iptables.Client
	if err := netns.Do(a.NS, func() error {
		var err error
		c, err = iptables.New(ctx, iptables.Config{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	fw := &dataplane.Firewall{IPT: nsiptables.IPT{NS: a.NS, C: c}, CreateChain: true, JumpFrom: "INPUT",
		Templates: []iptables.Rule{{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}}}
	be, closeFn, err := kernelvxlan.Open(a.NS, kernelvxlan.Config{Device: "flannel.1", Firewall: fw}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	node := func() string {
		var links []string
		for _, l := range strings.Split(strings.TrimSpace(run("ip -o link show")), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				links = append(links, strings.SplitN(f[1], "@", 2)[0])
			}
		}
		return strings.Join(links, " ") + "\n" + vxlantest.SaveRules(run("iptables-save -t filter"))
	}
	before := node()
	cfg := Default()
	cfg.StateDir = t.TempDir() + "/state"
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}

	if k, err := be.KeepPortOpen(ctx, true); err != nil || len(k.Opened) != 1 {
		t.Fatalf("keep: %+v, %v", k, err)
	}
	m, err := operation.New(ctx, operation.Options{Backend: be, Store: operation.FileStore{Dir: cfg.StateDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Prepare(ctx, "op-1", 8472, 4889); err != nil {
		t.Fatal(err)
	}
	inFlight := node()
	if _, err := Cleanup(ctx, cfg, be); err == nil || !strings.Contains(err.Error(), "op-1 is PREPARED") {
		t.Fatalf("cleanup with an operation in flight: %v; want a refusal naming it", err)
	}
	if got := node(); got != inFlight {
		t.Fatalf("a refused cleanup changed the node:\n%s\nwas:\n%s", got, inFlight)
	}
	if _, err := os.Stat(cfg.StateDir); err != nil {
		t.Fatalf("a refused cleanup removed the state: %v", err)
	}
	if _, err := m.Rollback(ctx, "op-1", "test"); err != nil {
		t.Fatal(err)
	}
	// What a crash between Prebuild and its undo would leave.
	snap, err := a.Kernel.Snapshot("flannel.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Kernel.Prebuild(snap, 4889); err != nil {
		t.Fatal(err)
	}
	rep, err := Cleanup(ctx, cfg, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed: %q", rep.Removed)
	if got := node(); got != before {
		t.Fatalf("after cleanup:\n%s\nwant as before Cutover ran:\n%s", got, before)
	}
	if _, err := os.Stat(cfg.StateDir); !os.IsNotExist(err) {
		t.Fatalf("state directory after cleanup: %v", err)
	}
	if _, err := Cleanup(ctx, cfg, be); err != nil {
		t.Fatalf("cleanup again: %v", err)
	}
}
