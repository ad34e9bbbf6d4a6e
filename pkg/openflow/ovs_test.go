package openflow_test

// Privileged: against a real ovs-vswitchd (userspace datapath) started by
// ovsproc in a fresh network namespace. The client's writes are read back
// with ovs-ofctl from the real bridge and compared with the fake given the
// same operations, so the fake is held to what OVS really does.

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/openflow"
)

func startOVS(t testing.TB, ctx context.Context) *ovsproc.Instance {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")
	ns := testenv.Netns(t, "cot-of")
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: t.TempDir(), Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the netns cleanup, so it runs first.
	t.Cleanup(func() {
		if err := inst.Stop(); err != nil {
			t.Errorf("stop ovs: %v", err)
		}
	})
	// OpenShift SDN's shape: br0 with vxlan0 on ofport 1.
	if _, err := inst.Vsctl(ctx, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
		"--", "add-port", "br0", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "ofport_request=1"); err != nil {
		t.Fatal(err)
	}
	return inst
}

func parse(t testing.TB, s string) openflow.Flow {
	t.Helper()
	f, err := openflow.ParseFlow(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// realAndFake is a fresh OVS with br0, a client of it, and a fake in the same
// state: a new bridge holds one flow, the NORMAL fallback.
func realAndFake(t *testing.T, ctx context.Context) (*ovsproc.Instance, *openflow.Client, *openflow.Fake) {
	t.Helper()
	inst := startOVS(t, ctx)
	fake := openflow.NewFake("br0")
	if err := fake.AddFlow(ctx, "br0", parse(t, "priority=0,actions=NORMAL")); err != nil {
		t.Fatal(err)
	}
	return inst, &openflow.Client{RunDir: inst.Dir}, fake
}

func TestOVSFlows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, c, fake := realAndFake(t, ctx)
	both := func(op func(openflow.Interface) error) {
		t.Helper()
		for _, ofi := range []openflow.Interface{c, fake} {
			if err := op(ofi); err != nil {
				t.Fatal(err)
			}
		}
	}
	realDump := func() []openflow.Flow {
		t.Helper()
		flows, err := c.DumpFlows(ctx, "br0")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := openflow.CanonicalDump(flows), fake.DumpBridge("br0"); got != want {
			t.Fatalf("real bridge:\n%s\nfake:\n%s", got, want)
		}
		return flows
	}

	drop := parse(t, "table=0,priority=200,udp,udp_dst=4789,actions=drop")
	for range 2 { // add-flow of an identical flow replaces it: still one.
		both(func(o openflow.Interface) error { return o.AddFlow(ctx, "br0", drop) })
	}
	flows := realDump()
	want := openflow.Flow{Table: 0, Priority: 200, Match: []openflow.Field{{Key: "udp"}, {Key: "tp_dst", Value: "4789"}}, Actions: "drop"}
	if n := countEqual(flows, want); n != 1 {
		t.Fatalf("drop flow found %d times, want 1, typed as %+v in %+v", n, want, flows)
	}
	// Independent read-back with plain ovs-ofctl.
	out, err := inst.Ofctl(ctx, "-O", "OpenFlow13", "dump-flows", "br0")
	if err != nil || !strings.Contains(out, "priority=200,udp,tp_dst=4789 actions=drop") {
		t.Fatalf("ovs-ofctl dump-flows = %q, %v", out, err)
	}

	others := []openflow.Flow{
		parse(t, "table=0,priority=100,in_port=1,actions=goto_table:10"),
		parse(t, "cookie=0x1234,table=10,priority=100,ip,nw_dst=198.18.1.0/24,actions=set_field:198.18.0.2->tun_dst,output:1"),
		parse(t, "table=10,priority=100,arp,arp_tpa=198.18.1.0/24,actions=move:NXM_NX_REG0[]->NXM_NX_TUN_IPV4_DST[],output:1"),
		parse(t, "table=20,priority=5,reg0=1,dl_dst=00:11:22:33:44:55,actions=load:0x2->NXM_NX_REG1[],resubmit(,30)"),
	}
	for _, f := range others {
		both(func(o openflow.Interface) error { return o.AddFlow(ctx, "br0", f) })
	}
	realDump()

	// Non-strict delete by match removes the drop flow and nothing else.
	both(func(o openflow.Interface) error {
		return o.DelFlows(ctx, "br0", openflow.Flow{Table: 0, Match: []openflow.Field{{Key: "udp"}, {Key: "udp_dst", Value: "4789"}}})
	})
	flows = realDump()
	if countEqual(flows, want) != 0 || len(flows) != 1+len(others) {
		t.Fatalf("after DelFlows: %+v", flows)
	}
	for _, f := range others {
		if countEqual(flows, f.Normalize()) != 1 {
			t.Fatalf("flow %s missing after deleting the drop flow:\n%s", f, openflow.CanonicalDump(flows))
		}
	}

	// A wider prefix deletes the more specific ip flow, only with its cookie.
	wide := openflow.Flow{Table: 10, Cookie: 0x99, Match: []openflow.Field{{Key: "ip"}, {Key: "nw_dst", Value: "198.18.0.0/16"}}}
	both(func(o openflow.Interface) error { return o.DelFlows(ctx, "br0", wide) })
	realDump()
	wide.Cookie = 0x1234
	both(func(o openflow.Interface) error { return o.DelFlows(ctx, "br0", wide) })
	// Strict: the wrong priority deletes nothing, the right one its flow.
	arp := others[2]
	arp.Priority = 101
	both(func(o openflow.Interface) error { return o.DelFlowStrict(ctx, "br0", arp) })
	if len(realDump()) != 4 {
		t.Fatal("strict delete with another priority removed a flow")
	}
	both(func(o openflow.Interface) error { return o.DelFlowStrict(ctx, "br0", others[2]) })
	flows = realDump()
	if len(flows) != 3 {
		t.Fatalf("want NORMAL, in_port and reg0 flows, got:\n%s", openflow.CanonicalDump(flows))
	}

	if _, err := c.DumpFlows(ctx, "br9"); !openflow.IsNotFound(err) || !strings.Contains(err.Error(), "br9") {
		t.Fatalf("missing bridge: %v, want IsNotFound naming br9", err)
	}
	// ovs-ofctl's own check still speaks for the flows we cannot model.
	err = c.AddFlow(ctx, "br0", openflow.Flow{Priority: 1, Match: []openflow.Field{{Key: "nosuchfield", Value: "1"}}, Actions: "drop"})
	if err == nil || !strings.Contains(err.Error(), "nosuchfield") || !strings.Contains(err.Error(), "add-flow br0") {
		t.Fatalf("unknown field: %v, want an error with argv and ovs-ofctl's output", err)
	}
}

func countEqual(flows []openflow.Flow, f openflow.Flow) int {
	n := 0
	for _, x := range flows {
		if x.Table == f.Table && x.Priority == f.Priority && x.Cookie == f.Cookie && x.Actions == f.Actions &&
			len(x.Match) == len(f.Match) && !slices.ContainsFunc(f.Match, func(m openflow.Field) bool { return !slices.Contains(x.Match, m) }) {
			n++
		}
	}
	return n
}

// TestOVSAddFlowsAndCookieDelete: AddFlows installs a batch in one run
// (replacing same-match flows, as AddFlow), and a cookie-only delete
// removes exactly that cookie's flows, on real OVS and the fake alike.
func TestOVSAddFlowsAndCookieDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, c, fake := realAndFake(t, ctx)
	batch := []openflow.Flow{
		parse(t, "cookie=0x77,table=0,priority=101,ip,nw_dst=198.19.2.0/24,actions=drop"),
		parse(t, "cookie=0x77,table=0,priority=101,arp,arp_tpa=198.19.2.0/24,actions=drop"),
		parse(t, "cookie=0x78,table=0,priority=100,ip,nw_dst=198.19.3.0/24,actions=drop"),
	}
	for _, ofi := range []openflow.Interface{c, fake} {
		for range 2 { // a replay replaces, still three
			if err := ofi.AddFlows(ctx, "br0", batch); err != nil {
				t.Fatal(err)
			}
		}
		if err := ofi.DelFlows(ctx, "br0", openflow.Flow{Table: 0, Cookie: 0x77}); err != nil {
			t.Fatal(err)
		}
	}
	flows, err := c.DumpFlows(ctx, "br0")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := openflow.CanonicalDump(flows), fake.DumpBridge("br0"); got != want {
		t.Fatalf("real bridge:\n%s\nfake:\n%s", got, want)
	}
	if len(flows) != 2 {
		t.Fatalf("after the cookie delete: %v, want the NORMAL fallback and cookie 0x78's flow", flows)
	}
	if err := c.DelFlows(ctx, "br0", openflow.Flow{Table: 0}); err == nil {
		t.Fatal("a delete with neither match nor cookie was not refused")
	}
}
