package iptables

import (
	"errors"
	"strings"
	"testing"
)

func TestFakeIdempotent(t *testing.T) {
	f := NewFake("")
	if err := f.EnsureRule(allow(4889)); !IsNotFound(err) {
		t.Fatalf("EnsureRule into a missing chain: %v, want IsNotFound", err)
	} else if !strings.Contains(err.Error(), "OS_FIREWALL_ALLOW") {
		t.Fatalf("error does not name the chain: %v", err)
	}
	for range 3 {
		if err := f.EnsureChain("filter", DefaultChain); err != nil {
			t.Fatal(err)
		}
		if err := f.EnsureRule(allow(4889)); err != nil {
			t.Fatal(err)
		}
		if err := f.EnsureRule(allow(4789)); err != nil {
			t.Fatal(err)
		}
		if err := f.EnsureJump("filter", "INPUT", DefaultChain); err != nil {
			t.Fatal(err)
		}
	}
	want := `*filter
:INPUT ACCEPT
:FORWARD ACCEPT
:OUTPUT ACCEPT
:OS_FIREWALL_ALLOW -
-A INPUT -j OS_FIREWALL_ALLOW
-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4789 -j ACCEPT
-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT
COMMIT
`
	// EnsureRule inserts at the top: the rule ensured last comes first.
	if got := f.Dump(); got != want {
		t.Fatalf("Dump:\n%s\nwant:\n%s", got, want)
	}
	if ok, err := f.HasRule(allow(4889)); !ok || err != nil {
		t.Fatalf("HasRule = %v, %v", ok, err)
	}
	for range 2 {
		if err := f.DeleteRule(allow(4789)); err != nil {
			t.Fatal(err)
		}
	}
	rules, err := f.ListRules("filter", DefaultChain)
	if err != nil || len(rules) != 1 || rules[0] != allow(4889).String() {
		t.Fatalf("ListRules = %q, %v", rules, err)
	}
	if _, err := f.ListRules("filter", "NOPE"); !IsNotFound(err) {
		t.Fatalf("ListRules of a missing chain: %v", err)
	}
	// Deleting from a chain or table never written is not an error.
	if err := f.DeleteRule(Rule{Table: "raw", Chain: "X", Proto: "udp", DPort: 1, Target: "NOTRACK"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.HasRule(Rule{Table: "raw", Chain: "X", Proto: "udp", DPort: 1, Target: "NOTRACK"}); ok || err != nil {
		t.Fatalf("HasRule in missing chain = %v, %v", ok, err)
	}
}

func TestFakeRejectsBadInputAndHook(t *testing.T) {
	f := NewFake(BackendLegacy)
	if f.Backend() != BackendLegacy {
		t.Fatal(f.Backend())
	}
	if err := f.EnsureRule(Rule{Table: "filter", Chain: "C", Proto: "udp", Target: "ACCEPT"}); !IsValidation(err) {
		t.Fatalf("port 0: %v", err)
	}
	if err := f.EnsureChain("nope", "C"); !IsValidation(err) {
		t.Fatalf("bad table: %v", err)
	}
	boom := errors.New("xtables lock held")
	f.Hook = func(op, _, _ string) error {
		if op == "EnsureRule" {
			return boom
		}
		return nil
	}
	if err := f.EnsureChain("filter", "C"); err != nil {
		t.Fatal(err)
	}
	err := f.EnsureRule(Rule{Table: "filter", Chain: "C", Proto: "udp", DPort: 9, Target: "ACCEPT"})
	if !errors.Is(err, boom) {
		t.Fatalf("hook error not returned: %v", err)
	}
	if strings.Contains(f.Dump(), "dport 9") {
		t.Fatal("failed EnsureRule changed state")
	}
}
