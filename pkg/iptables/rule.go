// Package iptables owns the node's firewall rules for the overlay port: the
// ACCEPT rule that opens a VXLAN port (OpenShift's OS_FIREWALL_ALLOW /
// OPENSHIFT-FIREWALL-ALLOW) and the raw-table NOTRACK rule beside it.
//
// It drives the iptables binaries through github.com/coreos/go-iptables with
// the backend (nft or legacy) that the node already uses, detected once and
// never mixed: rules written with the other backend would be invisible to the
// CNI and to an operator's iptables-save. It writes typed Rules only, appends
// when absent and deletes when present, so every call is idempotent.
//
// It must not decide policy: which chain, which port, whether a chain is
// created or jumped to from INPUT are the caller's choices. It must not flush
// or delete chains it did not create, and it does not touch IPv6.
package iptables

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Default table and chain for the allow rule when the agent configures
// nothing: the chain OpenShift 3.x nodes already jump to from INPUT.
const (
	DefaultTable = "filter"
	DefaultChain = "OS_FIREWALL_ALLOW"
)

// Rule is one port rule of the kind the product writes, e.g.
//
//	-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT
//	-A OPENSHIFT-NOTRACK -p udp -m udp --dport 4889 -j NOTRACK   (table raw)
//
// The field order of Spec is the order iptables-save prints, so String()
// equals the line iptables-save shows for the installed rule on both backends.
type Rule struct {
	Table string // filter, raw, nat, mangle or security
	Chain string
	Proto string // "udp" or "tcp"
	DPort uint16 // 1-65535
	// StateNew adds `-m state --state NEW`, written as the field report
	// (docs/design.md) writes it so a rule added by hand is recognised as ours.
	StateNew bool
	Target   string // ACCEPT, NOTRACK, DROP, or a chain name
	Comment  string // optional; -m comment --comment
}

// Builtin chains per table: they exist without EnsureChain and are the only
// ones with a policy.
var builtinChains = map[string][]string{
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"raw":      {"PREROUTING", "OUTPUT"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

// maxNameLen is XT_EXTENSION_MAXNAMELEN-1: the kernel's limit on chain and
// target names.
const maxNameLen = 28

const maxCommentLen = 256 // XT_MAX_COMMENT_LEN-1

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// ValidationError says which field of a Rule (or argument) was wrong, with
// which value and why.
type ValidationError struct {
	Field  string
	Value  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("iptables: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

func validTable(table string) error {
	if _, ok := builtinChains[table]; !ok {
		return &ValidationError{"table", table, "must be one of filter, raw, nat, mangle, security"}
	}
	return nil
}

// validChain checks a table and a chain name, as every chain operation does.
func validChain(table, chain string) error {
	if err := validTable(table); err != nil {
		return err
	}
	return validName("chain", chain)
}

func validName(field, name string) error {
	switch {
	case name == "":
		return &ValidationError{field, name, "must not be empty"}
	case len(name) > maxNameLen:
		return &ValidationError{field, name, fmt.Sprintf("longer than %d characters (kernel limit)", maxNameLen)}
	case !nameRE.MatchString(name):
		return &ValidationError{field, name, "may hold only letters, digits, '_', '.', '-' and must not start with '-' or '.'"}
	}
	return nil
}

// Validate checks every field; the error names the first bad one.
func (r Rule) Validate() error {
	if err := validTable(r.Table); err != nil {
		return err
	}
	if err := validName("chain", r.Chain); err != nil {
		return err
	}
	if r.Proto != "udp" && r.Proto != "tcp" {
		return &ValidationError{"proto", r.Proto, `must be "udp" or "tcp"`}
	}
	if r.DPort == 0 {
		return &ValidationError{"dport", "0", "must be 1-65535"}
	}
	if err := validName("target", r.Target); err != nil {
		return err
	}
	if len(r.Comment) > maxCommentLen {
		return &ValidationError{"comment", r.Comment, fmt.Sprintf("longer than %d bytes", maxCommentLen)}
	}
	for _, c := range r.Comment {
		// Quotes and backslashes would be escaped differently by the two
		// backends' save output; control characters break line-based tools.
		if c < 0x20 || c > 0x7e || c == '"' || c == '\'' || c == '\\' {
			return &ValidationError{"comment", r.Comment, "must be printable ASCII without quotes or backslashes"}
		}
	}
	return nil
}

// Spec is the argv after the chain name, as passed to iptables -A/-C/-D.
func (r Rule) Spec() []string {
	s := []string{"-p", r.Proto}
	if r.StateNew {
		s = append(s, "-m", "state", "--state", "NEW")
	}
	s = append(s, "-m", r.Proto, "--dport", strconv.Itoa(int(r.DPort)))
	if r.Comment != "" {
		s = append(s, "-m", "comment", "--comment", r.Comment)
	}
	return append(s, "-j", r.Target)
}

// String is the rule as iptables-save prints it (without the table header).
func (r Rule) String() string {
	spec := r.Spec()
	var b strings.Builder
	b.WriteString("-A ")
	b.WriteString(r.Chain)
	for i, a := range spec {
		b.WriteByte(' ')
		if i > 0 && spec[i-1] == "--comment" {
			a = saveQuote(a)
		}
		b.WriteString(a)
	}
	return b.String()
}

const noQuoteChars = "_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// saveQuote mimics libxtables' xtables_save_string: bare when the value holds
// only [A-Za-z0-9_-], double-quoted otherwise (Validate rules out the
// characters that would need escaping).
func saveQuote(s string) string {
	if s == "" || strings.TrimLeft(s, noQuoteChars) != "" {
		return `"` + s + `"`
	}
	return s
}
