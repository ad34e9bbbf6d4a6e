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

// realRig is the backend over a real ovsdb-server + ovs-vswitchd and real
// iptables in a fresh namespace, with br0 and vxlan0 on 4789 and the old
// port's rule in place; port and rules read the outcome back with the stock
// tools (ovs-vsctl, iptables-save), not through the code under test.
type realRig struct {
	b     *Backend
	inst  *ovsproc.Instance
	ns    string
	in    func(fn func() error) // runs fn on a thread inside the namespace
	port  func() string
	rules func() string
}

func newRealRig(ctx context.Context, t *testing.T) realRig {
	t.Helper()
	testenv.RequirePrivileged(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "iptables", "ip")
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
	r := realRig{inst: inst, ns: ns}
	// Everything that execs iptables runs on a thread inside the namespace.
	r.in = func(fn func() error) {
		t.Helper()
		if err := netns.Do(ns, fn); err != nil {
			t.Fatal(err)
		}
	}
	r.in(func() error {
		ipt, err := iptables.New(ctx, iptables.Config{Backend: iptables.BackendNFT})
		if err != nil {
			return err
		}
		ports, err := udpport.Open("")
		if err != nil {
			return err
		}
		r.b, err = New(Config{OVS: drv, Interface: "vxlan0", Bridge: "br0", Ports: ports,
			Firewall: &dataplane.Firewall{IPT: ipt, CreateChain: true, Templates: []iptables.Rule{allowTemplate}}})
		if err != nil {
			return err
		}
		rule := allowTemplate
		rule.DPort = 4789
		if err := ipt.EnsureChain("filter", "OS_FIREWALL_ALLOW"); err != nil {
			return err
		}
		return ipt.EnsureRule(rule)
	})
	r.port = func() string {
		out, err := inst.Vsctl(ctx, "get", "interface", "vxlan0", "options:dst_port")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Trim(strings.TrimSpace(out), `"`)
	}
	r.rules = func() string {
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
	return r
}

// TestRealOVSAndIptables drives the backend against a real ovsdb-server +
// ovs-vswitchd and real iptables in a fresh namespace.
func TestRealOVSAndIptables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newRealRig(ctx, t)
	b, in, port, rules := r.b, r.in, r.port, r.rules

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
	if p, r := port(), rules(); p != "4789" || r != "4889 4789" {
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

// TestRealFinalizeRefusesOffNewPort: on real OVS, Finalize refuses while
// vxlan0 is not on the new port (a commit that never landed; the interface
// deleted by hand), and removes no rule; Preflight, Read and Ready report
// the deleted interface as missing, not as port 0 or a held port.
func TestRealFinalizeRefusesOffNewPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newRealRig(ctx, t)
	var snap dataplane.Snapshot
	r.in(func() error {
		var err error
		if snap, err = r.b.Snapshot(ctx, 4789, 4889); err != nil {
			return err
		}
		if err := r.b.Prepare(ctx, snap); err != nil {
			return err
		}
		err = r.b.Finalize(ctx, snap)
		if err == nil || !strings.Contains(err.Error(), "vxlan0 is on port 4789, not 4889") || !strings.Contains(err.Error(), "not removing port 4789's rules") {
			t.Fatalf("Finalize before commit = %v, want a refusal naming vxlan0, 4789 and 4889", err)
		}
		return nil
	})
	if p, rs := r.port(), r.rules(); p != "4789" || rs != "4889 4789" {
		t.Fatalf("after a refused finalize: port %s rules %q; want 4789 and both rules", p, rs)
	}
	r.in(func() error { _, err := r.b.Commit(ctx, snap); return err })
	if _, err := r.inst.Vsctl(ctx, "del-port", "br0", "vxlan0"); err != nil {
		t.Fatal(err)
	}
	const missing = "vxlan0 not found in OVS bridge br0: "
	r.in(func() error {
		if err := r.b.Finalize(ctx, snap); err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "not removing port 4789's rules") {
			t.Fatalf("Finalize with vxlan0 deleted = %v, want %q and a refusal", err, missing)
		}
		c, err := r.b.Preflight(ctx, 4999)
		if err != nil || c.CurrentPort != 0 || !c.TargetFree || len(c.Problems) != 1 || !strings.HasPrefix(c.Problems[0], missing) {
			t.Fatalf("Preflight with vxlan0 deleted = %+v %v, want port 0 (unknown), target free, one problem %q", c, err, missing)
		}
		if nr := r.b.Ready(ctx); len(nr) != 1 || nr[0] != c.Problems[0] {
			t.Fatalf("Ready = %q, want [%q]", nr, c.Problems[0])
		}
		return nil
	})
	if rs := r.rules(); rs != "4889 4789" {
		t.Fatalf("after a refused finalize: rules %q; want both", rs)
	}
}
