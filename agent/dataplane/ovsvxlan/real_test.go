package ovsvxlan

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

// TestRealOVSAndIptables drives the backend against a real ovsdb-server +
// ovs-vswitchd and real iptables in a fresh namespace, and reads every
// outcome back with the stock tools (ovs-vsctl, iptables-save), not through
// the code under test.
func TestRealOVSAndIptables(t *testing.T) {
	testenv.RequirePrivileged(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "iptables", "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b4 := make([]byte, 4)
	_, _ = rand.Read(b4)
	ns := "cot-ovsb-" + hex.EncodeToString(b4)
	if err := netns.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(ns) })
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: t.TempDir(), Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	if _, err := inst.Vsctl(ctx, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
		"--", "add-port", "br0", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "options:dst_port=4789", "ofport_request=1"); err != nil {
		t.Fatal(err)
	}
	drv, err := ovs.New(ovs.Config{Addr: "unix:" + inst.DBSock})
	if err != nil {
		t.Fatal(err)
	}
	var b *Backend
	// Everything that execs iptables runs on a thread inside the namespace.
	in := func(fn func() error) {
		t.Helper()
		if err := netns.Do(ns, fn); err != nil {
			t.Fatal(err)
		}
	}
	in(func() error {
		ipt, err := iptables.New(ctx, iptables.Config{Backend: iptables.BackendNFT})
		if err != nil {
			return err
		}
		ports, err := udpport.Open("")
		if err != nil {
			return err
		}
		b, err = New(Config{OVS: drv, Interface: "vxlan0", Ports: ports,
			Firewall: &dataplane.Firewall{IPT: ipt, CreateChain: true, Templates: []iptables.Rule{allowTemplate}}})
		if err != nil {
			return err
		}
		r := allowTemplate
		r.DPort = 4789
		if err := ipt.EnsureChain("filter", "OS_FIREWALL_ALLOW"); err != nil {
			return err
		}
		return ipt.EnsureRule(r)
	})
	port := func() string {
		out, err := inst.Vsctl(ctx, "get", "interface", "vxlan0", "options:dst_port")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Trim(strings.TrimSpace(out), `"`)
	}
	rules := func() string {
		out, err := netns.Command(ns, "iptables-nft-save", "-t", "filter").Output()
		if err != nil {
			t.Fatal(err)
		}
		var ports []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-A OS_FIREWALL_ALLOW") {
				f := strings.Fields(l)
				for i := range f {
					if f[i] == "--dport" {
						ports = append(ports, f[i+1])
					}
				}
			}
		}
		return strings.Join(ports, " ")
	}

	var snap dataplane.Snapshot
	in(func() error {
		c, err := b.Preflight(ctx, 4889)
		if err != nil || len(c.Problems) > 0 || c.CurrentPort != 4789 {
			t.Fatalf("preflight: %+v %v", c, err)
		}
		if snap, err = b.Snapshot(ctx, 4789, 4889); err != nil {
			return err
		}
		return b.Prepare(ctx, snap)
	})
	if p, r := port(), rules(); p != "4789" || r != "4789 4889" {
		t.Fatalf("after prepare: port %s rules %q; want 4789 and both rules", p, r)
	}
	in(func() error {
		st, err := b.Commit(ctx, snap)
		if err == nil && (st.Port != 4889 || st.Detail["ofport"] != "1") {
			t.Fatalf("commit read-back: %+v", st)
		}
		return err
	})
	if p := port(); p != "4889" {
		t.Fatalf("after commit: ovs-vsctl says dst_port=%s", p)
	}
	in(func() error { _, err := b.Revert(ctx, snap); return err })
	if p, r := port(), rules(); p != "4789" || r != "4789" {
		t.Fatalf("after revert: port %s rules %q; want 4789 and only the old rule", p, r)
	}
	// Second run to the end: prepare, commit, finalize.
	in(func() error {
		if err := b.Prepare(ctx, snap); err != nil {
			return err
		}
		if _, err := b.Commit(ctx, snap); err != nil {
			return err
		}
		if _, err := b.Commit(ctx, snap); err != nil { // replay
			return err
		}
		return b.Finalize(ctx, snap)
	})
	if p, r := port(), rules(); p != "4889" || r != "4889" {
		t.Fatalf("after finalize: port %s rules %q; want 4889 and only the new rule", p, r)
	}
	in(func() error {
		if nr := b.Ready(ctx); len(nr) > 0 {
			t.Fatalf("not ready: %v", nr)
		}
		return nil
	})
}
