package iptables

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// CanonicalSave rewrites iptables-save output (either backend) into the
// canonical text Fake.Dump prints: no comments or counters, tables sorted by
// name, builtin chains in kernel order then user chains sorted, rules grouped
// by chain in that order (order within a chain kept), and tables that hold
// nothing of interest (only builtin chains, ACCEPT policies, no rules)
// omitted, since which empty tables exist depends on the backend and on what
// has been listed before.
func CanonicalSave(save string) string {
	var tables []saveTable
	var cur *saveTable
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			tables = append(tables, saveTable{name: l[1:], policy: map[string]string{}, rules: map[string][]string{}})
			cur = &tables[len(tables)-1]
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l[1:])
			if len(f) < 2 {
				continue
			}
			if slices.Contains(builtinChains[cur.name], f[0]) {
				cur.policy[f[0]] = f[1]
			} else {
				cur.chains = append(cur.chains, f[0])
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) >= 2 {
				cur.rules[f[1]] = append(cur.rules[f[1]], l)
			}
		}
	}
	return formatSave(tables)
}

type saveTable struct {
	name   string
	chains []string            // user chains
	policy map[string]string   // builtin chain -> policy, when not ACCEPT
	rules  map[string][]string // chain -> "-A" lines
}

func (t saveTable) empty() bool {
	if len(t.chains) > 0 {
		return false
	}
	for _, p := range t.policy {
		if p != "ACCEPT" {
			return false
		}
	}
	for _, rs := range t.rules {
		if len(rs) > 0 {
			return false
		}
	}
	return true
}

func formatSave(tables []saveTable) string {
	sort.Slice(tables, func(i, j int) bool { return tables[i].name < tables[j].name })
	var b strings.Builder
	for _, t := range tables {
		if t.empty() {
			continue
		}
		user := slices.Clone(t.chains)
		sort.Strings(user)
		fmt.Fprintf(&b, "*%s\n", t.name)
		for _, c := range builtinChains[t.name] {
			p := t.policy[c]
			if p == "" {
				p = "ACCEPT"
			}
			fmt.Fprintf(&b, ":%s %s\n", c, p)
		}
		for _, c := range user {
			fmt.Fprintf(&b, ":%s -\n", c)
		}
		for _, c := range append(slices.Clone(builtinChains[t.name]), user...) {
			for _, r := range t.rules[c] {
				b.WriteString(r + "\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
