package ovsvxlan

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/ovs"
)

// TestStagedProblems: the openshift-sdn profile, an agent without
// OpenFlow access, no underlay address to bind the receive port to, a
// vxlan0 bound to a local_ip already, an unpinned internal MTU, an old
// port's receiver without the new port's (not ours) and a flow at table
// 0's top priority (where the redirects go) are refused by name.
func TestStagedProblems(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], "without OpenFlow access") {
		t.Fatalf("no OF: %q", p)
	}
	of := openflow.NewFake("br0")
	for _, f := range []string{"table=0,priority=100,in_port=1,actions=LOCAL",
		"table=0,priority=100,ip,nw_dst=198.19.2.0/24,actions=set_field:198.18.0.12->tun_dst,output:1"} {
		fl, err := openflow.ParseFlow(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := of.AddFlow(ctx, "br0", fl); err != nil {
			t.Fatal(err)
		}
	}
	r.b.cfg.OF = of
	// br0 with its own internal port, MTU pinned, and vxlan0; an
	// unpinned internal port of another bridge is none of its business.
	pin := func(mtu int64) {
		r.ovs.SetPort("br0", ovs.Interface{Name: "br0", Type: "internal", OFPort: 65534, MTURequest: mtu})
	}
	pin(1450)
	vxlan0, err := r.ovs.GetInterface(ctx, "vxlan0")
	if err != nil {
		t.Fatal(err)
	}
	r.ovs.SetPort("br0", vxlan0)
	r.ovs.SetPort("br1", ovs.Interface{Name: "br1", Type: "internal", OFPort: 65534})
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], "no underlay address") {
		t.Fatalf("no underlay address: %q", p)
	}
	r.b.cfg.RxLocalIP = netip.MustParseAddr("198.18.0.11")
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 0 {
		t.Fatalf("clean: %q", p)
	}
	bound := ovs.Interface{Name: "vxlan0", Type: "vxlan", OFPort: 1,
		Options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": "4789", "local_ip": "198.18.0.11"}}
	r.ovs.Set(bound)
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], `local_ip="198.18.0.11"`) {
		t.Fatalf("vxlan0 bound: %q", p)
	}
	delete(bound.Options, "local_ip")
	r.ovs.Set(bound)
	pin(0)
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], "br0 of br0 has no mtu_request") {
		t.Fatalf("unpinned: %q", p)
	}
	pin(1450)
	stranger := ovs.Interface{Name: "vxlan0-cot-old", Type: "vxlan", OFPort: 9, Options: map[string]string{"dst_port": "4789"}}
	r.ovs.SetPort("br0", stranger)
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], "vxlan0-cot-old exists already") {
		t.Fatalf("stranger: %q", p)
	}
	r.ovs.SetPort("br0", ovs.Interface{Name: "vxlan0-cot", Type: "vxlan", OFPort: 8, Options: map[string]string{"dst_port": "4889"}})
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 0 {
		t.Fatalf("a switched node's receivers: %q", p)
	}
	taken, _ := openflow.ParseFlow("table=0,priority=65535,arp,actions=NORMAL")
	if err := of.AddFlow(ctx, "br0", taken); err != nil {
		t.Fatal(err)
	}
	if p := r.b.StagedProblems(ctx, 4889); len(p) != 1 || !strings.Contains(p[0], "table 0's top priority is taken") {
		t.Fatalf("slot: %q", p)
	}
	r.b.cfg.SDN = true
	if p := r.b.StagedProblems(ctx, 4889); len(p) == 0 || !strings.Contains(p[0], "openshift-sdn profile does not support the staged strategy") {
		t.Fatalf("sdn: %q", p)
	}
}

// TestStagedLosesLess: what the agent tells strategy auto follows the lab's
// figures for the configuration: staged with or without the standing
// redirects (make bench-lab-ovs-n16-rounds, make bench-lab-staged-n32),
// never with the openshift-sdn profile.
func TestStagedLosesLess(t *testing.T) {
	for _, c := range []struct {
		sdn, standing bool
		want          bool
		note          string
	}{
		{false, false, true, "N = 16 (1 ms probes)"},
		{false, true, true, "no flow table change"},
		{true, true, false, "openshift-sdn"},
	} {
		b := &Backend{cfg: Config{SDN: c.sdn, StandingRedirects: c.standing}}
		if got, note := b.StagedLosesLess(); got != c.want || !strings.Contains(note, c.note) {
			t.Errorf("sdn %v standing %v: %v %q, want %v and a note with %q", c.sdn, c.standing, got, note, c.want, c.note)
		}
	}
}
