// Package nftables finds the host's native nftables chains that can drop
// the overlay's UDP port whatever iptables accepts, and opens or closes the
// port in them.
//
// Why: netfilter evaluates every base chain registered on a hook, in
// priority order, and an accept ends only the chain it is in; a drop in any
// of them is final. An ACCEPT that pkg/iptables writes into iptables-nft's
// `ip filter INPUT` therefore decides nothing on a host whose filtering
// lives in a table of its own (`table inet firewalld`, a hand-written
// `table inet filter` from /etc/nftables.conf): that table still drops the
// packet. Measured in agent/dataplane's privileged tests.
//
// It reads the ruleset with `nft -j list ruleset` and writes single rules
// with `nft insert rule` / `nft delete rule … handle N`, through the exec
// seam (the commands run in the calling thread's network namespace). Only
// IPv4/inet chains on the input hook are considered: the tunnel's packets
// are delivered to the node itself. It never flushes, and deletes only rules
// it wrote (recognised by their comment).
package nftables

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Chain is one chain of the ruleset; Hook is empty for a regular chain.
type Chain struct {
	Family, Table, Name string
	Type, Hook, Policy  string
	Prio                int
}

// Rule is one rule: where it is, its handle, comment and expressions.
type Rule struct {
	Family, Table, Chain string
	Handle               uint64
	Comment              string
	Expr                 []any
}

// Ruleset is the parsed output of `nft -j list ruleset`.
type Ruleset struct {
	Chains []Chain
	Rules  []Rule
}

// Parse reads `nft -j list ruleset` output.
func Parse(b []byte) (*Ruleset, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("nftables: parse ruleset: %w", err)
	}
	rs := &Ruleset{}
	for _, obj := range doc.Nftables {
		if raw, ok := obj["chain"]; ok {
			var c struct {
				Family, Table, Name, Type, Hook, Policy string
				Prio                                    int
			}
			if err := json.Unmarshal(raw, &c); err != nil {
				return nil, fmt.Errorf("nftables: parse chain: %w", err)
			}
			rs.Chains = append(rs.Chains, Chain(c))
		}
		if raw, ok := obj["rule"]; ok {
			var r struct {
				Family, Table, Chain string
				Handle               uint64
				Comment              string
				Expr                 []any
			}
			if err := json.Unmarshal(raw, &r); err != nil {
				return nil, fmt.Errorf("nftables: parse rule: %w", err)
			}
			rs.Rules = append(rs.Rules, Rule(r))
		}
	}
	return rs, nil
}

// Blocker is a base chain on the input hook that can drop UDP to the port:
// its policy is drop, or a drop/reject verdict is reachable from it (in the
// chain or in a chain it jumps or goes to), and no rule reachable from it
// accepts the port.
type Blocker struct {
	Family, Table, Chain string
	Policy               string
	// Why says what drops: "policy drop" or "drop/reject in chain X".
	Why string
}

// String names the chain as nft does.
func (b Blocker) String() string {
	return fmt.Sprintf("table %s %s chain %s (hook input, policy %s, %s)", b.Family, b.Table, b.Chain, b.Policy, b.Why)
}

// Owned says whether a table is written by the iptables backend in use
// (iptables-nft's `ip filter`, `ip raw`, …): its chains are pkg/iptables'
// business, not a foreign filter.
type Owned func(family, table string) bool

// IptablesNFTOwned is Owned for a node whose iptables backend is nft.
func IptablesNFTOwned(family, table string) bool {
	return family == "ip" && slices.Contains([]string{"filter", "raw", "mangle", "nat", "security"}, table)
}

// NoneOwned is Owned for a node on iptables-legacy: its rules are not in
// nftables at all, so every nftables table is another filter.
func NoneOwned(string, string) bool { return false }

// Blockers lists the base chains on the input hook, outside the owned
// tables, that can drop UDP to port: the chains an iptables ACCEPT cannot
// override. The analysis is conservative about drops (any drop or reject
// verdict reachable counts, whatever it matches) and trusts an explicit
// accept of the port (a rule matching udp/th dport == port, or a set or
// range holding it, with an accept verdict, reachable from the chain).
func (rs *Ruleset) Blockers(owned Owned, port uint16) []Blocker {
	var out []Blocker
	for _, c := range rs.Chains {
		if c.Hook != "input" || (c.Family != "ip" && c.Family != "inet") || owned(c.Family, c.Table) {
			continue
		}
		why := ""
		if c.Policy == "drop" {
			why = "policy drop"
		}
		accepts := false
		for _, name := range rs.reachable(c.Family, c.Table, c.Name) {
			for _, r := range rs.rules(c.Family, c.Table, name) {
				if why == "" && dropsOrRejects(r.Expr) && !elsewhere(r.Expr, port) {
					why = "drop/reject in chain " + name
				}
				if acceptsPort(r.Expr, port) {
					accepts = true
				}
			}
		}
		if why != "" && !accepts {
			out = append(out, Blocker{Family: c.Family, Table: c.Table, Chain: c.Name, Policy: c.Policy, Why: why})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func (rs *Ruleset) rules(family, table, chain string) []Rule {
	var out []Rule
	for _, r := range rs.Rules {
		if r.Family == family && r.Table == table && r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// reachable returns chain and every chain of its table reached from it by
// jump or goto (verdict maps included).
func (rs *Ruleset) reachable(family, table, chain string) []string {
	seen := map[string]bool{chain: true}
	order := []string{chain}
	for i := 0; i < len(order); i++ {
		for _, r := range rs.rules(family, table, order[i]) {
			for _, t := range targets(r.Expr) {
				if !seen[t] {
					seen[t] = true
					order = append(order, t)
				}
			}
		}
	}
	return order
}

// walk calls fn for every JSON object (map) inside v.
func walk(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, e := range x {
			walk(e, fn)
		}
	case []any:
		for _, e := range x {
			walk(e, fn)
		}
	}
}

func targets(expr []any) []string {
	var out []string
	walk(expr, func(m map[string]any) {
		for _, k := range []string{"jump", "goto"} {
			if j, ok := m[k].(map[string]any); ok {
				if t, ok := j["target"].(string); ok {
					out = append(out, t)
				}
			}
		}
	})
	return out
}

func dropsOrRejects(expr []any) bool {
	found := false
	walk(expr, func(m map[string]any) {
		if _, ok := m["drop"]; ok {
			found = true
		}
		if _, ok := m["reject"]; ok {
			found = true
		}
	})
	return found
}

// elsewhere reports whether a rule's matches rule out UDP to port for a new
// packet, so its drop cannot hit it: another transport protocol (tcp dport
// 22 drop), a destination port match that does not hold port (Calico's
// drop of VXLAN from unknown hosts on the old port), or ct state invalid.
func elsewhere(expr []any, port uint16) bool {
	for _, e := range expr {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		match, ok := m["match"].(map[string]any)
		if !ok {
			continue
		}
		op, _ := match["op"].(string)
		if op != "==" && op != "in" {
			continue
		}
		left, _ := match["left"].(map[string]any)
		if pl, ok := left["payload"].(map[string]any); ok {
			switch pl["protocol"] {
			case "tcp", "icmp", "icmpv6", "sctp", "dccp":
				return true
			case "udp", "th":
				if pl["field"] == "dport" && !holds(match["right"], port) {
					return true
				}
			}
		}
		if meta, ok := left["meta"].(map[string]any); ok && meta["key"] == "l4proto" && !holdsName(match["right"], "udp") {
			return true
		}
		if ct, ok := left["ct"].(map[string]any); ok && ct["key"] == "state" {
			if st, ok := match["right"].(string); ok && st == "invalid" {
				return true
			}
		}
	}
	return false
}

// acceptsPort: the rule's verdict is accept and one of its matches is
// `udp dport` / `th dport` equal to, or a set or range holding, port.
func acceptsPort(expr []any, port uint16) bool {
	if len(expr) == 0 {
		return false
	}
	last, ok := expr[len(expr)-1].(map[string]any)
	if !ok {
		return false
	}
	if _, ok := last["accept"]; !ok {
		return false
	}
	for _, e := range expr {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		match, ok := m["match"].(map[string]any)
		if !ok {
			continue
		}
		if op, _ := match["op"].(string); op != "==" && op != "in" {
			continue
		}
		left, _ := match["left"].(map[string]any)
		pl, _ := left["payload"].(map[string]any)
		if pl == nil || pl["field"] != "dport" || (pl["protocol"] != "udp" && pl["protocol"] != "th") {
			continue
		}
		if holds(match["right"], port) {
			return true
		}
	}
	return false
}

// holds reports whether an nft JSON value (number, set, range) holds port.
func holds(v any, port uint16) bool {
	switch x := v.(type) {
	case float64:
		return x == float64(port)
	case string:
		n, err := strconv.Atoi(x)
		return err == nil && n == int(port)
	case map[string]any:
		if s, ok := x["set"]; ok {
			return holds(s, port)
		}
		if r, ok := x["range"].([]any); ok && len(r) == 2 {
			lo, lok := r[0].(float64)
			hi, hok := r[1].(float64)
			return lok && hok && float64(port) >= lo && float64(port) <= hi
		}
	case []any:
		for _, e := range x {
			if holds(e, port) {
				return true
			}
		}
	}
	return false
}

// holdsName reports whether an nft JSON value (a name or a set of names)
// holds name.
func holdsName(v any, name string) bool {
	switch x := v.(type) {
	case string:
		return x == name
	case map[string]any:
		return holdsName(x["set"], name)
	case []any:
		for _, e := range x {
			if holdsName(e, name) {
				return true
			}
		}
	}
	return false
}

// Comment marks the rules this package writes, per port, so that Close
// deletes only those.
func Comment(port uint16) string { return fmt.Sprintf("cutover-open-udp-%d", port) }

// Opening is the rule this package writes at the top of a blocker chain.
type Opening struct {
	Family, Table, Chain string
	Port                 uint16
}

// String is the opening as a key and as nft would be told it.
func (o Opening) String() string {
	return fmt.Sprintf("nft insert rule %s %s %s %s comment %q", o.Family, o.Table, o.Chain, o.match(), Comment(o.Port))
}

func (o Opening) match() string {
	m := fmt.Sprintf("udp dport %d accept", o.Port)
	if o.Family == "inet" {
		m = "meta nfproto ipv4 " + m // the overlay is IPv4; leave IPv6 as it was
	}
	return m
}

// Ours returns the handles of the rules this package wrote for port in
// family/table/chain.
func (rs *Ruleset) Ours(family, table, chain string, port uint16) []uint64 {
	var out []uint64
	for _, r := range rs.rules(family, table, chain) {
		if r.Comment == Comment(port) {
			out = append(out, r.Handle)
		}
	}
	return out
}

// OursAnywhere returns the openings this package wrote for port, in any
// chain.
func (rs *Ruleset) OursAnywhere(port uint16) []Opening {
	var out []Opening
	seen := map[Opening]bool{}
	for _, r := range rs.Rules {
		if r.Comment != Comment(port) {
			continue
		}
		o := Opening{Family: r.Family, Table: r.Table, Chain: r.Chain, Port: port}
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

// Client runs nft through the exec seam.
type Client struct {
	// Run is the exec seam; nil runs the real nft.
	Run execseam.Func
	// Bin is the nft binary; empty means "nft" on PATH.
	Bin string
}

func (c *Client) run(ctx context.Context, args ...string) ([]byte, error) {
	run, bin := c.Run, c.Bin
	if run == nil {
		run = execseam.Exec
	}
	if bin == "" {
		bin = "nft"
	}
	return run(ctx, append([]string{bin}, args...), nil)
}

// Ruleset reads the whole ruleset.
func (c *Client) Ruleset(ctx context.Context) (*Ruleset, error) {
	out, err := c.run(ctx, "-j", "list", "ruleset")
	if err != nil {
		return nil, fmt.Errorf("nftables: list ruleset: %w", err)
	}
	return Parse(out)
}

// Insert writes o at the top of its chain unless a rule of ours for the
// port is there already.
func (c *Client) Insert(ctx context.Context, rs *Ruleset, o Opening) error {
	if len(rs.Ours(o.Family, o.Table, o.Chain, o.Port)) > 0 {
		return nil
	}
	args := []string{"insert", "rule", o.Family, o.Table, o.Chain}
	args = append(args, strings.Fields(o.match())...)
	args = append(args, "comment", strconv.Quote(Comment(o.Port)))
	if _, err := c.run(ctx, args...); err != nil {
		return fmt.Errorf("nftables: %s: %w", o, err)
	}
	return nil
}

// Delete removes the rules of ours for o's port in o's chain.
func (c *Client) Delete(ctx context.Context, rs *Ruleset, o Opening) error {
	for _, h := range rs.Ours(o.Family, o.Table, o.Chain, o.Port) {
		if _, err := c.run(ctx, "delete", "rule", o.Family, o.Table, o.Chain, "handle", strconv.FormatUint(h, 10)); err != nil {
			return fmt.Errorf("nftables: delete %s (handle %d): %w", o, h, err)
		}
	}
	return nil
}
