package nftables

// Unit tests of the ruleset analysis, on `nft -j list ruleset` output
// captured from nft 1.0.6 (testdata/*.nft loaded with nft -f into a fresh
// namespace; *.json is what nft printed). The privileged proof that the
// analysis matches what the kernel does is in agent/dataplane.

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"
)

func load(t *testing.T, name string) *Ruleset {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestBlockersFirewalld(t *testing.T) {
	rs := load(t, "firewalld")
	// 4889 is allowed nowhere: filter_INPUT ends in a reject.
	got := rs.Blockers(IptablesNFTOwned, 4889)
	if len(got) != 1 || got[0].Table != "firewalld" || got[0].Chain != "filter_INPUT" || got[0].Family != "inet" {
		t.Fatalf("blockers for 4889 = %+v, want firewalld's filter_INPUT", got)
	}
	if !strings.Contains(got[0].String(), "table inet firewalld chain filter_INPUT") {
		t.Errorf("String() = %q does not name the table and chain as nft does", got[0])
	}
	// A port in a set, in a range, reached through jump and goto: open.
	for _, p := range []uint16{4789, 8472, 9000, 9050, 9100} {
		if b := rs.Blockers(IptablesNFTOwned, p); len(b) != 0 {
			t.Errorf("port %d is accepted in filter_IN_public_allow, got blockers %+v", p, b)
		}
	}
	// tcp dport 22 does not open UDP 22.
	if b := rs.Blockers(IptablesNFTOwned, 22); len(b) != 1 {
		t.Errorf("UDP 22: got %+v, want the reject to count (the accept is TCP)", b)
	}
}

func TestBlockersOwnedTables(t *testing.T) {
	rs := load(t, "inetdrop")
	// With iptables-nft, ip filter is iptables' own: only inet filter's
	// input (policy drop) blocks; its forward chain is not on the input hook.
	got := rs.Blockers(IptablesNFTOwned, 4889)
	want := []Blocker{{Family: "inet", Table: "filter", Chain: "input", Policy: "drop", Why: "policy drop"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("nft backend: blockers = %+v, want %+v", got, want)
	}
	// With iptables-legacy, ip filter is a table of its own too; it accepts
	// 4889 before its reject, so only for another port does it block.
	if got := rs.Blockers(NoneOwned, 4889); len(got) != 1 || got[0].Table != "filter" || got[0].Family != "inet" {
		t.Fatalf("legacy backend, port 4889: blockers = %+v, want inet filter only", got)
	}
	got = rs.Blockers(NoneOwned, 4890)
	if len(got) != 2 || got[0].Family != "inet" || got[1].Family != "ip" || got[1].Why != "drop/reject in chain INPUT" {
		t.Fatalf("legacy backend, port 4890: blockers = %+v, want inet filter input and ip filter INPUT", got)
	}
}

func TestOpeningAndOurs(t *testing.T) {
	rs, err := Parse([]byte(`{"nftables":[{"rule":{"family":"inet","table":"filter","chain":"input","handle":9,"comment":"cutover-open-udp-4889","expr":[{"accept":null}]}},
{"rule":{"family":"inet","table":"filter","chain":"input","handle":3,"comment":"other","expr":[{"accept":null}]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if h := rs.Ours("inet", "filter", "input", 4889); !reflect.DeepEqual(h, []uint64{9}) {
		t.Errorf("Ours = %v, want [9] (the rule with our comment only)", h)
	}
	if h := rs.Ours("inet", "filter", "input", 4890); len(h) != 0 {
		t.Errorf("Ours(4890) = %v, want none", h)
	}
	o := Opening{Family: "inet", Table: "filter", Chain: "input", Port: 4889}
	if got := rs.OursAnywhere(4889); !reflect.DeepEqual(got, []Opening{o}) {
		t.Errorf("OursAnywhere = %+v", got)
	}
	want := `nft insert rule inet filter input meta nfproto ipv4 udp dport 4889 accept comment "cutover-open-udp-4889"`
	if o.String() != want {
		t.Errorf("String = %q, want %q", o, want)
	}
}

func TestClientArgv(t *testing.T) {
	var ran [][]string
	c := &Client{Run: func(_ context.Context, argv, _ []string) ([]byte, error) {
		ran = append(ran, argv)
		return nil, nil
	}}
	rs := &Ruleset{Rules: []Rule{{Family: "ip", Table: "t", Chain: "c", Handle: 7, Comment: Comment(4889)}}}
	if err := c.Insert(context.Background(), &Ruleset{}, Opening{Family: "ip", Table: "t", Chain: "c", Port: 4889}); err != nil {
		t.Fatal(err)
	}
	if err := c.Insert(context.Background(), rs, Opening{Family: "ip", Table: "t", Chain: "c", Port: 4889}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), rs, Opening{Family: "ip", Table: "t", Chain: "c", Port: 4889}); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"nft", "insert", "rule", "ip", "t", "c", "udp", "dport", "4889", "accept", "comment", `"cutover-open-udp-4889"`},
		// the second Insert finds ours and runs nothing
		{"nft", "delete", "rule", "ip", "t", "c", "handle", "7"},
	}
	if !reflect.DeepEqual(ran, want) {
		t.Fatalf("ran %q\nwant %q", ran, want)
	}
}

func TestParseBadInput(t *testing.T) {
	if _, err := Parse([]byte("table inet x {")); err == nil || !strings.Contains(err.Error(), "parse ruleset") {
		t.Fatalf("text instead of JSON: err = %v, want a parse error", err)
	}
}

// Drops whose matches rule out a new UDP packet to the port do not make a
// blocker: Calico's drop of VXLAN on its own (old) port, TCP and ICMP
// drops, ct state invalid. The same drop on the port itself does.
func TestBlockersIgnoreDropsElsewhere(t *testing.T) {
	rs := load(t, "narrowdrops")
	if got := rs.Blockers(IptablesNFTOwned, 4889); len(got) != 0 {
		t.Errorf("port 4889: blockers = %+v, want none (every drop matches something else)", got)
	}
	// 4789 is accepted from 198.18.0.0/15 before its drop: trusted as open.
	if got := rs.Blockers(IptablesNFTOwned, 4789); len(got) != 0 {
		t.Errorf("port 4789: blockers = %+v, want none (an explicit accept of the port)", got)
	}
	rs.Rules = append(rs.Rules, Rule{Family: "ip", Table: "calico", Chain: "filter-INPUT", Handle: 99,
		Expr: []any{map[string]any{"match": map[string]any{"op": "==", "left": map[string]any{"payload": map[string]any{"protocol": "udp", "field": "dport"}}, "right": float64(4889)}}, map[string]any{"drop": nil}}})
	if got := rs.Blockers(IptablesNFTOwned, 4889); len(got) != 1 || got[0].Why != "drop/reject in chain filter-INPUT" {
		t.Errorf("with udp dport 4889 drop: blockers = %+v, want filter-INPUT", got)
	}
}
