package openflow

import (
	"reflect"
	"strings"
	"testing"
)

// The flows the product writes, in add-flow syntax.
var productFlows = []string{
	// OpenShift SDN drops pod traffic to the VXLAN port.
	"table=0,priority=200,udp,udp_dst=4789,actions=drop",
	"table=0,priority=100,in_port=1,actions=goto_table:10",
	"table=10,priority=100,ip,nw_dst=198.18.1.0/24,actions=set_field:198.18.0.2->tun_dst,output:1",
	"table=10,priority=100,arp,arp_tpa=198.18.1.0/24,actions=move:NXM_NX_REG0[]->NXM_NX_TUN_IPV4_DST[],output:1",
	"cookie=0x1234,table=20,priority=5,reg0=0x1,dl_dst=00:11:22:33:44:55,actions=load:0x2->NXM_NX_REG1[],resubmit(,30)",
	"table=31,priority=8,ct_state=+trk+new,ip,actions=ct(commit,table=32),NORMAL",
}

func TestRoundTrip(t *testing.T) {
	for _, s := range productFlows {
		f, err := ParseFlow(s)
		if err != nil {
			t.Fatalf("ParseFlow(%q): %v", s, err)
		}
		if got := f.String(); got != s {
			t.Errorf("String() = %q, want %q", got, s)
		}
		g, err := ParseFlow(f.DumpString())
		if err != nil || !reflect.DeepEqual(f, g) {
			t.Errorf("DumpString %q parses to %+v, %v; want %+v", f.DumpString(), g, err, f)
		}
	}
}

func TestParseFlow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Flow
	}{
		{
			"table=0,priority=200,udp,udp_dst=4789,actions=drop",
			Flow{Table: 0, Priority: 200, Match: []Field{{"udp", ""}, {"udp_dst", "4789"}}, Actions: "drop"},
		},
		{
			// No priority: DefaultPriority. Space before actions, as dumped.
			"in_port=1 actions=output:2",
			Flow{Priority: DefaultPriority, Match: []Field{{"in_port", "1"}}, Actions: "output:2"},
		},
		{
			// OF1.3 dump-flows line: counters dropped.
			" cookie=0x0, duration=0.101s, table=0, n_packets=0, n_bytes=0, priority=200,udp,tp_dst=4789 actions=drop",
			Flow{Priority: 200, Match: []Field{{"udp", ""}, {"tp_dst", "4789"}}, Actions: "drop"},
		},
		{
			// OF1.0 dump with idle_age, timeouts and flags.
			" cookie=0x1234, duration=3.5s, table=10, n_packets=7, n_bytes=420, idle_timeout=50, hard_timeout=100, send_flow_rem idle_age=1, priority=7,ip,nw_dst=198.18.1.0/24 actions=set_field:198.18.0.2->tun_dst,output:1",
			Flow{Table: 10, Priority: 7, Cookie: 0x1234, Match: []Field{{"ip", ""}, {"nw_dst", "198.18.1.0/24"}}, Actions: "set_field:198.18.0.2->tun_dst,output:1"},
		},
		{
			"priority=0 actions=NORMAL",
			Flow{Priority: 0, Actions: "NORMAL"},
		},
		{
			// Actions with nested commas and '='.
			"table=3,priority=1,arp,actions=learn(table=4,priority=2,NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[]),resubmit(,5)",
			Flow{Table: 3, Priority: 1, Match: []Field{{"arp", ""}}, Actions: "learn(table=4,priority=2,NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[]),resubmit(,5)"},
		},
		{"cookie=42,priority=1,actions=drop", Flow{Cookie: 42, Priority: 1, Actions: "drop"}},
	} {
		got, err := ParseFlow(tc.in)
		if err != nil {
			t.Errorf("ParseFlow(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseFlow(%q) =\n%+v\nwant\n%+v", tc.in, got, tc.want)
		}
	}
}

func TestParseFlowErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"table=0,udp", "actions"},
		{"table=0,actions=", "actions"},
		{"table=300,actions=drop", `table "300": must be a table number 0-254`},
		{"table=255,actions=drop", "table"},
		{"priority=70000,actions=drop", `priority "70000"`},
		{"priority=1,priority=2,actions=drop", "given twice"},
		{"cookie=0x1/-1,actions=drop", "cookie"},
		{"udp_dst=4789,actions=drop", "needs one of udp, udp6"},
		{"tp_dst=4789,ip,actions=drop", "needs one of udp"},
		{"nw_dst=198.18.0.1,actions=drop", "nw_dst"},
		{"arp_tpa=198.18.0.1,ip,actions=drop", "needs one of arp"},
		{"in_port=,actions=drop", "no value"},
		{"1bad=2,actions=drop", "key must be"},
		{"priority=1,actions=drop\nx", "one line"},
	} {
		_, err := ParseFlow(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !IsValidation(err) {
			t.Errorf("ParseFlow(%q) = %v, want a validation error with %q", tc.in, err, tc.want)
		}
	}
	// Spelled-out prerequisites are trusted, as ovs-ofctl does.
	if _, err := ParseFlow("dl_type=0x0800,nw_proto=17,tp_dst=5,actions=drop"); err != nil {
		t.Errorf("dl_type/nw_proto flow: %v", err)
	}
}

func TestValidateMatchField(t *testing.T) {
	f := Flow{Priority: 1, Actions: "drop", Match: []Field{{"table", "1"}}}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "flow property") {
		t.Fatalf("Validate = %v", err)
	}
	f.Match = []Field{{"in_port", "1,2"}}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), `"in_port=1,2"`) {
		t.Fatalf("Validate = %v", err)
	}
}

func TestNormalizeAndCanonicalDump(t *testing.T) {
	var flows []Flow
	for _, s := range []string{
		"table=30,priority=1,tp_dst=53,udp_src=1,nw_dst=198.18.1.1,reg0=2,in_port=5,dl_dst=00:11:22:33:44:55,tun_id=5,udp,metadata=1,actions=drop",
		"table=0,priority=200,udp,udp_dst=4789,actions=drop",
		"table=0,priority=300,ip,ip_dst=198.18.0.0/15,actions=drop",
		"priority=0,actions=NORMAL",
	} {
		f, err := ParseFlow(s)
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, f.Normalize())
	}
	// The udp line is what OVS 3.1 prints for the same flow.
	want := `cookie=0x0, table=0, priority=300,ip,nw_dst=198.18.0.0/15 actions=drop
cookie=0x0, table=0, priority=200,udp,tp_dst=4789 actions=drop
cookie=0x0, table=0, priority=0 actions=NORMAL
cookie=0x0, table=30, priority=1,udp,reg0=0x2,tun_id=0x5,metadata=0x1,in_port=5,dl_dst=00:11:22:33:44:55,nw_dst=198.18.1.1,tp_src=1,tp_dst=53 actions=drop
`
	if got := CanonicalDump(flows); got != want {
		t.Fatalf("CanonicalDump:\n%s\nwant:\n%s", got, want)
	}
}

func TestCovers(t *testing.T) {
	parse := func(s string) []Field {
		f, err := ParseFlow(s + ",actions=drop")
		if err != nil {
			t.Fatal(err)
		}
		return f.Normalize().Match
	}
	for _, tc := range []struct {
		del, flow string
		want      bool
	}{
		{"udp,udp_dst=4789", "udp,tp_dst=4789", true},
		{"ip", "udp,tp_dst=4789", true},
		{"udp", "ip", false},
		{"udp,udp_dst=4789", "udp,tp_dst=4889", false},
		{"ip,nw_dst=198.18.0.0/16", "ip,nw_dst=198.18.1.0/24", true},
		{"ip,nw_dst=198.18.1.0/24", "ip,nw_dst=198.18.0.0/16", false},
		{"ip,nw_dst=198.18.1.0/24", "ip,nw_dst=198.18.1.7", true},
		{"in_port=1", "in_port=1,ip", true},
		{"in_port=1,ip", "in_port=1", false},
	} {
		if got := covers(parse(tc.del), parse(tc.flow)); got != tc.want {
			t.Errorf("covers(%s, %s) = %v, want %v", tc.del, tc.flow, got, tc.want)
		}
	}
}
