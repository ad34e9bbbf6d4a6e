package iptables

import (
	"errors"
	"strings"
	"testing"
)

func allow(port uint16) Rule {
	return Rule{Table: "filter", Chain: DefaultChain, Proto: "udp", DPort: port, StateNew: true, Target: "ACCEPT"}
}

func TestRuleSpecAndString(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		spec string
		save string
	}{
		{
			allow(4889),
			"-p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT",
			"-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT",
		},
		{
			Rule{Table: "raw", Chain: "OPENSHIFT-NOTRACK", Proto: "udp", DPort: 4789, Target: "NOTRACK"},
			"-p udp -m udp --dport 4789 -j NOTRACK",
			"-A OPENSHIFT-NOTRACK -p udp -m udp --dport 4789 -j NOTRACK",
		},
		{
			Rule{Table: "filter", Chain: "C", Proto: "tcp", DPort: 65535, Target: "DROP", Comment: "cutover new port"},
			"-p tcp -m tcp --dport 65535 -m comment --comment cutover new port -j DROP",
			`-A C -p tcp -m tcp --dport 65535 -m comment --comment "cutover new port" -j DROP`,
		},
		{
			// '.' is quoted by libxtables, '-' and '_' are not.
			Rule{Table: "filter", Chain: "C", Proto: "udp", DPort: 1, Target: "ACCEPT", Comment: "op-1_x"},
			"-p udp -m udp --dport 1 -m comment --comment op-1_x -j ACCEPT",
			"-A C -p udp -m udp --dport 1 -m comment --comment op-1_x -j ACCEPT",
		},
		{
			Rule{Table: "filter", Chain: "C", Proto: "udp", DPort: 1, Target: "ACCEPT", Comment: "v1.2"},
			"-p udp -m udp --dport 1 -m comment --comment v1.2 -j ACCEPT",
			`-A C -p udp -m udp --dport 1 -m comment --comment "v1.2" -j ACCEPT`,
		},
	} {
		if err := tc.r.Validate(); err != nil {
			t.Errorf("%+v: Validate: %v", tc.r, err)
		}
		if got := strings.Join(tc.r.Spec(), " "); got != tc.spec {
			t.Errorf("Spec = %q, want %q", got, tc.spec)
		}
		if got := tc.r.String(); got != tc.save {
			t.Errorf("String = %q, want %q", got, tc.save)
		}
	}
}

func TestRuleValidate(t *testing.T) {
	ok := allow(4889)
	for _, tc := range []struct {
		name  string
		mod   func(*Rule)
		field string
		want  string // in the message
	}{
		{"table", func(r *Rule) { r.Table = "filtr" }, "table", `"filtr"`},
		{"empty chain", func(r *Rule) { r.Chain = "" }, "chain", "must not be empty"},
		{"long chain", func(r *Rule) { r.Chain = strings.Repeat("A", 29) }, "chain", "longer than 28"},
		{"chain option", func(r *Rule) { r.Chain = "-F" }, "chain", "must not start with '-'"},
		{"chain space", func(r *Rule) { r.Chain = "A B" }, "chain", `"A B"`},
		{"proto", func(r *Rule) { r.Proto = "icmp" }, "proto", `"icmp"`},
		{"no proto", func(r *Rule) { r.Proto = "" }, "proto", `must be "udp" or "tcp"`},
		{"port 0", func(r *Rule) { r.DPort = 0 }, "dport", "1-65535"},
		{"no target", func(r *Rule) { r.Target = "" }, "target", "must not be empty"},
		{"target injection", func(r *Rule) { r.Target = "ACCEPT -m x" }, "target", "may hold only"},
		{"comment quote", func(r *Rule) { r.Comment = `a"b` }, "comment", "quotes"},
		{"comment newline", func(r *Rule) { r.Comment = "a\nb" }, "comment", "printable"},
		{"comment long", func(r *Rule) { r.Comment = strings.Repeat("x", 257) }, "comment", "longer than 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			err := r.Validate()
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate(%+v) = %v, want a ValidationError", r, err)
			}
			if ve.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q (field %s): want field %s and %q", err, ve.Field, tc.field, tc.want)
			}
			if !IsValidation(err) {
				t.Fatal("IsValidation false")
			}
		})
	}
}
