package openflow

import (
	"context"
	"errors"
	"testing"
)

func TestFake(t *testing.T) {
	ctx := context.Background()
	f := NewFake("br0")
	if err := f.AddFlow(ctx, "br1", Flow{Priority: 1, Actions: "drop"}); !IsNotFound(err) {
		t.Fatalf("unknown bridge: %v", err)
	}
	for range 2 {
		for _, s := range productFlows {
			if err := f.AddFlow(ctx, "br0", mustParse(t, s)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Same table/priority/match replaces the actions.
	if err := f.AddFlow(ctx, "br0", mustParse(t, "table=0,priority=100,in_port=1,actions=drop")); err != nil {
		t.Fatal(err)
	}
	want := `bridge br0:
cookie=0x0, table=0, priority=200,udp,tp_dst=4789 actions=drop
cookie=0x0, table=0, priority=100,in_port=1 actions=drop
cookie=0x0, table=10, priority=100,arp,arp_tpa=198.18.1.0/24 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_IPV4_DST[],output:1
cookie=0x0, table=10, priority=100,ip,nw_dst=198.18.1.0/24 actions=set_field:198.18.0.2->tun_dst,output:1
cookie=0x1234, table=20, priority=5,reg0=0x1,dl_dst=00:11:22:33:44:55 actions=load:0x2->NXM_NX_REG1[],resubmit(,30)
cookie=0x0, table=31, priority=8,ct_state=+trk+new,ip actions=ct(commit,table=32),NORMAL
`
	if got := f.Dump(); got != want {
		t.Fatalf("Dump:\n%s\nwant:\n%s", got, want)
	}
	// Non-strict by a wider prefix removes the ip flow, not the arp one.
	if err := f.DelFlows(ctx, "br0", Flow{Table: 10, Match: []Field{{"ip", ""}, {"nw_dst", "198.18.0.0/16"}}}); err != nil {
		t.Fatal(err)
	}
	// Strict with the wrong priority removes nothing; the right one does.
	if err := f.DelFlowStrict(ctx, "br0", mustParse(t, "table=0,priority=201,udp,udp_dst=4789,actions=drop")); err != nil {
		t.Fatal(err)
	}
	if err := f.DelFlowStrict(ctx, "br0", mustParse(t, "table=20,priority=5,dl_dst=00:11:22:33:44:55,reg0=1,actions=drop")); err != nil {
		t.Fatal(err)
	}
	// A cookie that differs protects the flow.
	if err := f.DelFlows(ctx, "br0", Flow{Table: 31, Cookie: 9, Match: []Field{{"ip", ""}}}); err != nil {
		t.Fatal(err)
	}
	want = `cookie=0x0, table=0, priority=200,udp,tp_dst=4789 actions=drop
cookie=0x0, table=0, priority=100,in_port=1 actions=drop
cookie=0x0, table=10, priority=100,arp,arp_tpa=198.18.1.0/24 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_IPV4_DST[],output:1
cookie=0x0, table=31, priority=8,ct_state=+trk+new,ip actions=ct(commit,table=32),NORMAL
`
	if got := f.DumpBridge("br0"); got != want {
		t.Fatalf("after deletes:\n%s\nwant:\n%s", got, want)
	}
	flows, _ := f.DumpFlows(ctx, "br0")
	flows[0].Match[0].Key = "mutated"
	if f.DumpBridge("br0") != want {
		t.Fatal("DumpFlows shares state with the fake")
	}

	boom := errors.New("vswitchd down")
	f.Hook = func(op, _ string) error {
		if op == "AddFlow" {
			return boom
		}
		return nil
	}
	if err := f.AddFlow(ctx, "br0", Flow{Priority: 9, Actions: "drop"}); !errors.Is(err, boom) {
		t.Fatalf("hook: %v", err)
	}
	if f.DumpBridge("br0") != want {
		t.Fatal("failed AddFlow changed state")
	}
}
