package ovsvxlan

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

type sdnRig struct {
	ovs *ovs.Fake
	ipt *iptables.Fake
	of  *openflow.Fake
	b   *Backend
}

// newSDNRig is a node as openshift-sdn leaves it on port 4789: the
// OS_FIREWALL_ALLOW rule, the SDN's two chains with their rules, br0 with
// the drop flow and another flow of the SDN's that must never be touched.
func newSDNRig(t *testing.T) sdnRig {
	t.Helper()
	o := ovs.NewFake(ovs.Interface{Name: "vxlan0", Type: "vxlan", OFPort: 1,
		Options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": "4789"}})
	ipt := iptables.NewFake(iptables.BackendNFT)
	templates := append([]iptables.Rule{allowTemplate}, SDNFirewallTemplates()...)
	for _, r := range templates {
		if err := ipt.EnsureChain(r.Table, r.Chain); err != nil {
			t.Fatal(err)
		}
		r.DPort = 4789
		if err := ipt.EnsureRule(r); err != nil {
			t.Fatal(err)
		}
	}
	of := openflow.NewFake("br0")
	for _, f := range []openflow.Flow{SDNDropFlow(4789), {Table: 20, Priority: 0, Actions: "drop"}} {
		if err := of.AddFlow(context.Background(), "br0", f); err != nil {
			t.Fatal(err)
		}
	}
	b, err := New(Config{OVS: o, Interface: "vxlan0", Bridge: "br0", Ports: &udpport.Fake{},
		Firewall: &dataplane.Firewall{IPT: ipt, Templates: templates},
		Flows:    &PortFlows{OF: of, Bridge: "br0", Templates: []openflow.Flow{SDNDropFlow(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	return sdnRig{o, ipt, of, b}
}

// ports lists, per place, the VXLAN ports found there, as one line each.
func (r sdnRig) ports() string {
	var lines []string
	ipt := r.ipt.Dump()
	for _, chain := range []string{"OS_FIREWALL_ALLOW", SDNFirewallChain, SDNNoTrackChain} {
		var got []string
		for _, p := range []string{"4789", "4889"} {
			for _, l := range strings.Split(ipt, "\n") {
				if strings.HasPrefix(l, "-A "+chain+" ") && strings.Contains(l, "--dport "+p+" ") {
					got = append(got, p)
				}
			}
		}
		lines = append(lines, chain+": "+strings.Join(got, " "))
	}
	var flows []string
	for _, p := range []string{"4789", "4889"} {
		if strings.Contains(r.of.Dump(), "tp_dst="+p+" actions=drop") {
			flows = append(flows, p)
		}
	}
	lines = append(lines, "drop flow: "+strings.Join(flows, " "))
	if !strings.Contains(r.of.Dump(), "table=20, priority=0 actions=drop") {
		lines = append(lines, "SDN's table=20 default flow GONE")
	}
	port := "?"
	for _, p := range []string{"4789", "4889"} {
		if strings.Contains(r.ovs.Dump(), "dst_port="+p) {
			port = p
		}
	}
	return strings.Join(append(lines, "vxlan0: "+port), "\n")
}

func TestSDNProfileStatesInAnyOrder(t *testing.T) {
	ctx := context.Background()
	state := func(all, vx string) string {
		return strings.Join([]string{"OS_FIREWALL_ALLOW: " + all, SDNFirewallChain + ": " + all, SDNNoTrackChain + ": " + all, "drop flow: " + all, "vxlan0: " + vx}, "\n")
	}
	want := map[string]string{
		"prepare":  state("4789 4889", "4789"),
		"commit":   state("4789 4889", "4889"),
		"finalize": state("4889", "4889"),
		"abort":    state("4789", "4789"),
		"revert":   state("4789", "4789"),
	}
	sequences := [][]string{
		{"prepare", "commit", "finalize"},
		{"prepare", "abort"},
		{"prepare", "commit", "revert"},
		{"prepare", "revert"},
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 40; i++ {
		seq := sequences[rnd.IntN(len(sequences))]
		r := newSDNRig(t)
		snap, err := r.b.Snapshot(ctx, 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range seq {
			for rep := 0; rep < 1+rnd.IntN(3); rep++ {
				switch step {
				case "prepare":
					err = r.b.Prepare(ctx, snap)
				case "commit":
					_, err = r.b.Commit(ctx, snap)
				case "finalize":
					err = r.b.Finalize(ctx, snap)
				case "abort":
					err = r.b.Abort(ctx, snap)
				case "revert":
					_, err = r.b.Revert(ctx, snap)
				}
				if err != nil {
					t.Fatalf("%v: %s: %v", seq, step, err)
				}
				if got := r.ports(); got != want[step] {
					t.Fatalf("%v after %s (repeat %d):\n%s\nwant\n%s", seq, step, rep, got, want[step])
				}
			}
		}
	}
}

// The SDN's drop flow for the new port, there before the cutover (an SDN
// restarted early, say), stays when the cutover aborts.
func TestSDNProfileAbortKeepsPreexistingFlowAndRules(t *testing.T) {
	ctx := context.Background()
	r := newSDNRig(t)
	if err := r.of.AddFlow(ctx, "br0", SDNDropFlow(4889)); err != nil {
		t.Fatal(err)
	}
	nt := SDNFirewallTemplates()[1]
	nt.DPort = 4889
	if err := r.ipt.EnsureRule(nt); err != nil {
		t.Fatal(err)
	}
	snap, err := r.b.Snapshot(ctx, 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.b.Prepare(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Abort(ctx, snap); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{"OS_FIREWALL_ALLOW: 4789", SDNFirewallChain + ": 4789", SDNNoTrackChain + ": 4789 4889", "drop flow: 4789 4889", "vxlan0: 4789"}, "\n")
	if got := r.ports(); got != want {
		t.Fatalf("after abort:\n%s\nwant\n%s", got, want)
	}
}

func TestSDNProfilePreflightReportsWhatItTouches(t *testing.T) {
	ctx := context.Background()
	r := newSDNRig(t)
	if err := r.of.DelFlowStrict(ctx, "br0", SDNDropFlow(4789)); err != nil {
		t.Fatal(err)
	}
	c, err := r.b.Preflight(ctx, 4889)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.Actions, "\n")
	for _, w := range []string{
		`found in filter/OPENSHIFT-FIREWALL-ALLOW: -A OPENSHIFT-FIREWALL-ALLOW -p udp -m udp --dport 4789 -m comment --comment "VXLAN incoming" -j ACCEPT`,
		`found in raw/OPENSHIFT-NOTRACK: -A OPENSHIFT-NOTRACK -p udp -m udp --dport 4789 -j NOTRACK`,
		`not found on br0: cookie=0x0, table=20, priority=300,udp,tp_dst=4789 actions=drop`,
		`iptables -t raw -A OPENSHIFT-NOTRACK -p udp -m udp --dport 4889 -j NOTRACK`,
		`ovs-ofctl add-flow br0 table=20,priority=300,udp,udp_dst=4889,actions=drop`,
		`ovs-ofctl --strict del-flows br0 table=20,priority=300,udp,tp_dst=4789`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("preflight actions lack %q:\n%s", w, got)
		}
	}
	if len(c.Problems) != 0 {
		t.Errorf("problems: %v", c.Problems)
	}
	if r.ovs.Writes() != 0 || strings.Contains(r.of.Dump(), "4889") || strings.Contains(r.ipt.Dump(), "4889") {
		t.Fatal("preflight changed something")
	}
	// A missing SDN chain is a problem (the SDN is not running as expected).
	r2 := newSDNRig(t)
	fw := r2.b.cfg.Firewall
	fw.IPT = iptables.NewFake(iptables.BackendNFT)
	c, _ = r2.b.Preflight(ctx, 4889)
	if !strings.Contains(strings.Join(c.Problems, "\n"), "firewall chain raw/OPENSHIFT-NOTRACK does not exist") {
		t.Fatalf("missing chain not reported: %v", c.Problems)
	}
}

// Finalize closes the old port for good: it must first see the interface
// on the new port, as kernelvxlan's does. A commit that never landed, a
// port moved again behind the agent's back, or a deleted interface is
// refused with the interface, the port read and the port expected, and not
// one rule or flow goes.
func TestFinalizeRefusesUnlessOnNewPort(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		setup func(t *testing.T, r sdnRig, snap dataplane.Snapshot)
		want  []string
	}{
		{"never committed", func(*testing.T, sdnRig, dataplane.Snapshot) {},
			[]string{"vxlan0", "port 4789", "not 4889", "not removing", "4789"}},
		{"moved again behind the agent's back", func(t *testing.T, r sdnRig, snap dataplane.Snapshot) {
			if _, err := r.b.Commit(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if _, err := r.ovs.SetDstPort(ctx, "vxlan0", 4889, 5000); err != nil {
				t.Fatal(err)
			}
		}, []string{"vxlan0", "port 5000", "not 4889", "not removing"}},
		{"interface deleted", func(t *testing.T, r sdnRig, snap dataplane.Snapshot) {
			if _, err := r.b.Commit(ctx, snap); err != nil {
				t.Fatal(err)
			}
			r.ovs.Delete("vxlan0")
		}, []string{"vxlan0", "not found", "not removing"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newSDNRig(t)
			snap, err := r.b.Snapshot(ctx, 4789, 4889)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.b.Prepare(ctx, snap); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, r, snap)
			before := r.ipt.Dump() + r.of.Dump()
			err = r.b.Finalize(ctx, snap)
			if err == nil {
				t.Fatalf("Finalize succeeded; rules now:\n%s", r.ports())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Finalize error %q does not say %q", err, w)
				}
			}
			if after := r.ipt.Dump() + r.of.Dump(); after != before {
				t.Fatalf("refused Finalize changed the firewall or flows:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}
