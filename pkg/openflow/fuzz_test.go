package openflow

import (
	"reflect"
	"testing"
)

// FuzzParseFlow: whatever ParseFlow accepts is valid, prints back through
// String and DumpString, and parses again to the same Flow.
func FuzzParseFlow(f *testing.F) {
	for _, s := range productFlows {
		f.Add(s)
	}
	for _, s := range []string{
		" cookie=0x0, duration=0.101s, table=0, n_packets=0, n_bytes=0, priority=200,udp,tp_dst=4789 actions=drop",
		" cookie=0x1234, duration=3.5s, table=10, n_packets=7, n_bytes=420, idle_timeout=50, send_flow_rem idle_age=1, priority=7,ip,nw_dst=198.18.1.0/24 actions=set_field:198.18.0.2->tun_dst,output:1",
		"priority=0 actions=NORMAL",
		"in_port=1 actions=output:2",
		"table=3,arp,actions=learn(table=4,NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[])",
		"dl_type=0x0800,nw_proto=17,tp_dst=5,actions=drop",
		"table=0,udp",
		"actions=actions=drop",
		"xactions=1,actions=drop",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := ParseFlow(s)
		if err != nil {
			if !IsValidation(err) {
				t.Fatalf("ParseFlow(%q): error %v is not a validation error", s, err)
			}
			return
		}
		if err := fl.Validate(); err != nil {
			t.Fatalf("ParseFlow(%q) accepted an invalid flow: %v", s, err)
		}
		for _, text := range []string{fl.String(), fl.DumpString()} {
			g, err := ParseFlow(text)
			if err != nil {
				t.Fatalf("ParseFlow(%q) -> %q does not parse: %v", s, text, err)
			}
			if !reflect.DeepEqual(fl, g) {
				t.Fatalf("round trip of %q via %q:\n%+v\n%+v", s, text, fl, g)
			}
		}
		n := fl.Normalize()
		if !reflect.DeepEqual(n, n.Normalize()) {
			t.Fatalf("Normalize not idempotent for %q", s)
		}
	})
}
