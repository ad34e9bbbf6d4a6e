// Package openflow owns the OpenFlow flows the agent writes on an OVS bridge
// (OpenShift SDN's br0): typed flows that round-trip through ovs-ofctl text,
// and a driver that adds, deletes and dumps them with ovs-ofctl.
//
// All commands speak OpenFlow 1.3 (`-O OpenFlow13`), the version OpenShift
// SDN configures on br0, so actions render the same way everywhere (OF1.0
// would show goto_table as resubmit). The package only knows flows; which
// flows to write and when is the caller's decision. It must not touch OVSDB
// (bridges, ports, interfaces: that is pkg/ovsdb) and never deletes flows
// with an empty match (that would wipe a whole table of the CNI's flows).
package openflow

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// DefaultPriority is what OVS assumes (and ovs-ofctl omits) when a flow
// gives no priority.
const DefaultPriority = 32768

// Field is one match field: Key=Value, or a bare Key (protocol shorthands
// such as "udp", "ip", "arp") when Value is empty.
type Field struct {
	Key, Value string
}

func (f Field) String() string {
	if f.Value == "" {
		return f.Key
	}
	return f.Key + "=" + f.Value
}

// Flow is one OpenFlow flow as the agent writes and reads it. It models what
// identifies a flow (table, priority, match; cookie for bookkeeping) and what
// it does (Actions, kept verbatim as ovs-ofctl text). Counters, ages,
// timeouts, importance and flags are not modelled: the product writes none.
//
// Priority 0 is a real OpenFlow priority, so a Flow literal must set
// Priority (DefaultPriority is what ovs-ofctl means when none is given);
// ParseFlow fills it in when the text has none.
type Flow struct {
	Table    uint8
	Priority uint16
	Cookie   uint64
	Match    []Field // in the order written
	Actions  string  // e.g. "drop", "set_field:198.18.0.2->tun_dst,output:1"
}

// String is the flow in ovs-ofctl add-flow syntax, e.g.
// "table=0,priority=200,udp,udp_dst=4789,actions=drop".
func (f Flow) String() string {
	var b strings.Builder
	if f.Cookie != 0 {
		fmt.Fprintf(&b, "cookie=%#x,", f.Cookie)
	}
	fmt.Fprintf(&b, "table=%d,priority=%d", f.Table, f.Priority)
	if m := f.MatchString(); m != "" {
		b.WriteString("," + m)
	}
	b.WriteString(",actions=" + f.Actions)
	return b.String()
}

// MatchString is the match fields joined as ovs-ofctl writes them.
func (f Flow) MatchString() string {
	parts := make([]string, len(f.Match))
	for i, m := range f.Match {
		parts[i] = m.String()
	}
	return strings.Join(parts, ",")
}

// DumpString is the flow as `ovs-ofctl dump-flows` prints it, without the
// counters and with cookie, table and priority always shown, so two dumps
// compare as text: "cookie=0x0, table=0, priority=200,udp,tp_dst=4789 actions=drop".
func (f Flow) DumpString() string {
	s := fmt.Sprintf("cookie=%#x, table=%d, priority=%d", f.Cookie, f.Table, f.Priority)
	if m := f.MatchString(); m != "" {
		s += "," + m
	}
	return s + " actions=" + f.Actions
}

// Not modelled: dropped by ParseFlow. Counters and ages change by
// themselves; the rest the product never writes.
var dropped = map[string]bool{
	"duration": true, "n_packets": true, "n_bytes": true, "idle_age": true, "hard_age": true,
	"idle_timeout": true, "hard_timeout": true, "importance": true,
	"send_flow_rem": true, "check_overlap": true, "reset_counts": true,
	"no_packet_counts": true, "no_byte_counts": true, "out_port": true, "out_group": true,
}

// reserved keys can never be match fields.
func reserved(k string) bool {
	return dropped[k] || k == "table" || k == "priority" || k == "cookie" || k == "actions"
}

var (
	keyRE   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*(\[[0-9.]*\])?$`)
	valueRE = regexp.MustCompile(`^[^\s,=]+$`)
)

// ParseError says which part of a flow's text was wrong and why.
type ParseError struct {
	Text   string // the whole input
	Field  string // "table", "match", "actions", ...
	Value  string
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("openflow: flow %q: %s %q: %s", e.Text, e.Field, e.Value, e.Reason)
}

// ParseFlow reads a flow in ovs-ofctl add-flow syntax or a line of
// `ovs-ofctl dump-flows` output (with or without --no-stats). Counters and
// the other unmodelled properties are dropped; a missing priority becomes
// DefaultPriority; match fields keep their order and spelling.
func ParseFlow(s string) (Flow, error) {
	text := s
	f := Flow{Priority: DefaultPriority}
	head, actions, ok := splitActions(s)
	if !ok {
		return Flow{}, &ParseError{text, "actions", "", "missing (a flow needs actions=...)"}
	}
	f.Actions = strings.TrimSpace(actions)
	seen := map[string]bool{}
	for _, tok := range strings.FieldsFunc(head, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		k, v, hasValue := strings.Cut(tok, "=")
		if hasValue && v == "" {
			return Flow{}, &ParseError{text, "match", tok, "key with '=' but no value"}
		}
		switch {
		case k == "table" || k == "priority" || k == "cookie":
			if seen[k] {
				return Flow{}, &ParseError{text, k, v, "given twice"}
			}
			seen[k] = true
			if err := parseProperty(&f, k, v); err != nil {
				return Flow{}, &ParseError{text, k, v, err.Error()}
			}
		case dropped[k]:
		default:
			f.Match = append(f.Match, Field{Key: k, Value: v})
		}
	}
	if err := f.Validate(); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return Flow{}, &ParseError{text, ve.Field, ve.Value, ve.Reason}
		}
		return Flow{}, err
	}
	return f, nil
}

func parseProperty(f *Flow, k, v string) error {
	switch k {
	case "table":
		n, err := strconv.ParseUint(v, 10, 8)
		if err != nil || n > 254 {
			return errors.New("must be a table number 0-254")
		}
		f.Table = uint8(n)
	case "priority":
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return errors.New("must be 0-65535")
		}
		f.Priority = uint16(n)
	case "cookie":
		var n uint64
		var err error
		if h, ok := strings.CutPrefix(v, "0x"); ok {
			n, err = strconv.ParseUint(h, 16, 64)
		} else {
			n, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return errors.New("must be a 64-bit number, 0x-hex or decimal, without a mask")
		}
		f.Cookie = n
	}
	return nil
}

// splitActions finds "actions=" where a keyword can start (line start, after
// ',' or whitespace); everything after it is the actions, which may hold
// commas, parentheses and '='.
func splitActions(s string) (head, actions string, ok bool) {
	for i := 0; ; {
		j := strings.Index(s[i:], "actions=")
		if j < 0 {
			return "", "", false
		}
		j += i
		if j == 0 || s[j-1] == ',' || unicode.IsSpace(rune(s[j-1])) {
			return s[:j], s[j+len("actions="):], true
		}
		i = j + 1
	}
}

// ValidationError names the bad field of a Flow, its value and the reason.
type ValidationError struct {
	Field, Value, Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("openflow: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// IsValidation reports whether err is bad input (nothing was run).
func IsValidation(err error) bool {
	var ve *ValidationError
	var pe *ParseError
	return errors.As(err, &ve) || errors.As(err, &pe)
}

// Validate checks the flow's syntax and the prerequisites of the match
// fields it knows. The prerequisite check is a safety net: on del-flows,
// ovs-ofctl silently drops a field whose prerequisite is missing (udp_dst
// without udp), widening the delete to the whole table.
func (f Flow) Validate() error {
	if f.Table == 255 {
		return &ValidationError{"table", "255", "must be 0-254 (255 means all tables)"}
	}
	if strings.TrimSpace(f.Actions) == "" {
		return &ValidationError{"actions", f.Actions, `must not be empty (use "drop" to drop)`}
	}
	if strings.ContainsAny(f.Actions, "\n\r") {
		return &ValidationError{"actions", f.Actions, "must be one line"}
	}
	for _, m := range f.Match {
		if reserved(m.Key) {
			return &ValidationError{"match", m.String(), "is a flow property, not a match field"}
		}
		if !keyRE.MatchString(m.Key) {
			return &ValidationError{"match", m.String(), "key must be a field name like nw_dst or reg0"}
		}
		if m.Value != "" && !valueRE.MatchString(m.Value) {
			return &ValidationError{"match", m.String(), "value must not hold spaces, ',' or '='"}
		}
	}
	return checkPrereqs(f.Match)
}

var (
	l4Protos = map[string]string{ // shorthand -> family
		"udp": "ip", "tcp": "ip", "sctp": "ip", "icmp": "ip", "igmp": "ip",
		"udp6": "ipv6", "tcp6": "ipv6", "sctp6": "ipv6", "icmp6": "ipv6",
	}
	// field -> shorthands that satisfy its prerequisite (any of them).
	prereqs = map[string][]string{
		"udp_src": {"udp", "udp6"}, "udp_dst": {"udp", "udp6"},
		"tcp_src": {"tcp", "tcp6"}, "tcp_dst": {"tcp", "tcp6"}, "tcp_flags": {"tcp", "tcp6"},
		"sctp_src": {"sctp", "sctp6"}, "sctp_dst": {"sctp", "sctp6"},
		"tp_src":  {"udp", "tcp", "sctp", "udp6", "tcp6", "sctp6"},
		"tp_dst":  {"udp", "tcp", "sctp", "udp6", "tcp6", "sctp6"},
		"nw_src":  {"ip", "arp", "rarp", "udp", "tcp", "sctp", "icmp", "igmp"},
		"nw_dst":  {"ip", "arp", "rarp", "udp", "tcp", "sctp", "icmp", "igmp"},
		"ip_src":  {"ip", "udp", "tcp", "sctp", "icmp", "igmp"},
		"ip_dst":  {"ip", "udp", "tcp", "sctp", "icmp", "igmp"},
		"arp_spa": {"arp", "rarp"}, "arp_tpa": {"arp", "rarp"}, "arp_op": {"arp", "rarp"},
		"arp_sha": {"arp", "rarp"}, "arp_tha": {"arp", "rarp"},
	}
)

func checkPrereqs(match []Field) error {
	have := map[string]bool{}
	for _, m := range match {
		if m.Value == "" {
			have[m.Key] = true
		}
		if m.Key == "dl_type" || m.Key == "eth_type" || m.Key == "nw_proto" || m.Key == "ip_proto" {
			// Spelled out by hand: trust the writer, as ovs-ofctl does.
			return nil
		}
	}
	for _, m := range match {
		need, ok := prereqs[m.Key]
		if !ok || slices.ContainsFunc(need, func(p string) bool { return have[p] }) {
			continue
		}
		return &ValidationError{"match", m.String(), "needs one of " + strings.Join(need, ", ") + " in the match (ovs-ofctl would drop it silently on delete)"}
	}
	return nil
}

// aliases maps a field to the name ovs-ofctl prints for it.
var aliases = map[string]string{
	"udp_src": "tp_src", "udp_dst": "tp_dst", "tcp_src": "tp_src", "tcp_dst": "tp_dst",
	"sctp_src": "tp_src", "sctp_dst": "tp_dst", "ip_src": "nw_src", "ip_dst": "nw_dst",
	"eth_src": "dl_src", "eth_dst": "dl_dst",
}

// matchRank orders match fields as OVS's match_format prints those the
// product writes (conntrack fields, then protocol shorthand, then the rest);
// others keep their order after. Values are not rewritten beyond hex
// numbers: ct_state flags, for one, keep the order written.
var matchRank = map[string]int{
	"ct_state": -4, "ct_zone": -3, "ct_mark": -2, "ct_label": -1,
	"reg": 1, "tun_id": 2, "tun_src": 3, "tun_dst": 4, "metadata": 5, "in_port": 6,
	"vlan_tci": 7, "dl_src": 8, "dl_dst": 9, "nw_src": 10, "nw_dst": 11,
	"arp_spa": 12, "arp_tpa": 13, "arp_op": 14, "arp_sha": 15, "arp_tha": 16,
	"nw_tos": 17, "tp_src": 18, "tp_dst": 19,
}

var hexFields = regexp.MustCompile(`^(reg[0-9]+|tun_id|metadata)$`)

// Normalize rewrites the match as `ovs-ofctl dump-flows` shows it for the
// fields the product writes: aliases to their printed names (udp_dst ->
// tp_dst), registers, tun_id and metadata in hex, protocol shorthand first,
// fields in OVS's print order. It lets a fake's dump equal a real one.
func (f Flow) Normalize() Flow {
	out := f
	out.Match = make([]Field, 0, len(f.Match))
	for _, m := range f.Match {
		if a, ok := aliases[m.Key]; ok {
			m.Key = a
		}
		if hexFields.MatchString(m.Key) && m.Value != "" {
			v, mask, hasMask := strings.Cut(m.Value, "/")
			if n, err := strconv.ParseUint(v, 0, 64); err == nil {
				m.Value = fmt.Sprintf("%#x", n)
				if hasMask {
					m.Value += "/" + mask
				}
			}
		}
		out.Match = append(out.Match, m)
	}
	rank := func(m Field) int {
		if m.Value == "" {
			return 0
		}
		k := m.Key
		if strings.HasPrefix(k, "reg") && hexFields.MatchString(k) {
			k = "reg"
		}
		if r, ok := matchRank[k]; ok {
			return r
		}
		return 100
	}
	sort.SliceStable(out.Match, func(i, j int) bool { return rank(out.Match[i]) < rank(out.Match[j]) })
	return out
}

// CanonicalDump prints flows one DumpString per line, sorted as a reader
// scans a table: by table, then priority high to low, then text.
func CanonicalDump(flows []Flow) string {
	lines := make([]struct {
		table uint8
		prio  uint16
		s     string
	}, len(flows))
	for i, f := range flows {
		lines[i].table, lines[i].prio, lines[i].s = f.Table, f.Priority, f.DumpString()
	}
	sort.Slice(lines, func(i, j int) bool {
		a, b := lines[i], lines[j]
		if a.table != b.table {
			return a.table < b.table
		}
		if a.prio != b.prio {
			return a.prio > b.prio
		}
		return a.s < b.s
	})
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.s + "\n")
	}
	return b.String()
}

// covers reports whether a non-strict delete by match m removes a flow with
// match flow (both normalized): every field of m must be implied by flow.
// It knows shorthand implication (udp implies ip) and prefix containment
// for nw_src/nw_dst/arp_spa/arp_tpa; other masks must be equal.
func covers(m, flow []Field) bool {
	for _, want := range m {
		if !slices.ContainsFunc(flow, func(have Field) bool { return implies(have, want) }) {
			return false
		}
	}
	return true
}

func implies(have, want Field) bool {
	if have == want {
		return true
	}
	if want.Value == "" && have.Value == "" {
		return l4Protos[have.Key] == want.Key
	}
	if have.Key != want.Key {
		return false
	}
	switch want.Key {
	case "nw_src", "nw_dst", "arp_spa", "arp_tpa":
		w, err1 := parsePrefix(want.Value)
		h, err2 := parsePrefix(have.Value)
		return err1 == nil && err2 == nil && w.Bits() <= h.Bits() && w.Contains(h.Addr())
	}
	return false
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
