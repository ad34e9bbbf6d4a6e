package dataplane

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/nftables"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Firewall opens and closes the overlay port in the node's firewall: one rule
// per template (OS_FIREWALL_ALLOW by default; an SDN profile adds its own
// chains). A nil *Firewall manages nothing.
type Firewall struct {
	IPT iptables.Interface
	// Templates are the rules to hold for the port; their DPort is ignored.
	Templates []iptables.Rule
	// CreateChain creates a template's chain when it is missing instead of
	// failing preflight.
	CreateChain bool
	// JumpFrom, with CreateChain, is the built-in chain (INPUT) that must
	// jump to a template's chain: a chain nothing jumps to opens nothing,
	// and a chain Cutover created is one nothing else jumps to. The jump is
	// inserted at the top, before any catch-all REJECT. Created chains and
	// their jumps stay after Close: empty, they match nothing, and another
	// operation reuses them.
	JumpFrom string
	// NFT, when set, checks the host's native nftables tables for input
	// chains that would drop the port whatever iptables accepts
	// (firewalld's, /etc/nftables.conf's); NFTMode says what is done about
	// them (NFTOpen when empty).
	NFT     *nftables.Client
	NFTMode string

	skipNFT bool // test-only (export_test.go): the bite switch
}

// Rules returns the templates instantiated for port.
func (f *Firewall) Rules(port tunnelport.Port) []iptables.Rule {
	if f == nil {
		return nil
	}
	out := make([]iptables.Rule, len(f.Templates))
	for i, t := range f.Templates {
		t.DPort = uint16(port)
		out[i] = t
	}
	return out
}

// Present returns, for each rule of port, whether it is installed, keyed by
// the rule's iptables-save line.
func (f *Firewall) Present(port tunnelport.Port) (map[string]bool, error) {
	present := map[string]bool{}
	for _, r := range f.Rules(port) {
		ok, err := f.IPT.HasRule(r)
		if err != nil {
			return nil, fmt.Errorf("firewall: check %s: %w", r, err)
		}
		present[r.String()] = ok
	}
	if err := f.presentNFT(port, present); err != nil {
		return nil, err
	}
	return present, nil
}

// Open installs every rule of port (idempotent). The native nftables
// chains are dealt with first: when one of them is refused, nothing has
// changed.
func (f *Firewall) Open(port tunnelport.Port) error {
	if err := f.openNFT(port); err != nil {
		return err
	}
	for _, r := range f.Rules(port) {
		if f.CreateChain {
			if err := f.IPT.EnsureChain(r.Table, r.Chain); err != nil {
				return fmt.Errorf("firewall: create chain %s/%s: %w", r.Table, r.Chain, err)
			}
			if f.JumpFrom != "" && r.Table == "filter" && r.Chain != f.JumpFrom {
				if err := f.IPT.EnsureJump(r.Table, f.JumpFrom, r.Chain); err != nil {
					return fmt.Errorf("firewall: jump from %s to %s/%s: %w", f.JumpFrom, r.Table, r.Chain, err)
				}
			}
		}
		if err := f.IPT.EnsureRule(r); err != nil {
			return fmt.Errorf("firewall: open %s: %w", r, err)
		}
	}
	return nil
}

// Close removes the rules of port, except those listed in keep (rules that
// were there before Cutover touched the node stay).
func (f *Firewall) Close(port tunnelport.Port, keep map[string]bool) error {
	for _, r := range f.Rules(port) {
		if keep[r.String()] {
			continue
		}
		if err := f.IPT.DeleteRule(r); err != nil {
			return fmt.Errorf("firewall: close %s: %w", r, err)
		}
	}
	// The agent's own marked rule for the port (KeepOpen) goes with it:
	// Finalize closing the old port, an undo closing the target.
	for _, t := range f.Templates {
		if r := keepRule(t, port); !keep[r.String()] {
			if err := f.IPT.DeleteRule(r); err != nil && !iptables.IsNotFound(err) {
				return fmt.Errorf("firewall: close %s: %w", r, err)
			}
		}
	}
	return f.closeNFT(port, keep)
}

// Problems reports what would stop Open from working: a missing chain that
// may not be created.
func (f *Firewall) Problems() []string {
	if f == nil {
		return nil
	}
	var out []string
	for _, t := range f.Templates {
		if f.CreateChain {
			continue
		}
		if _, err := f.IPT.ListRules(t.Table, t.Chain); err != nil {
			if iptables.IsNotFound(err) {
				out = append(out, fmt.Sprintf("firewall chain %s/%s does not exist (create it and a jump to it from INPUT, or run the agent with --create-chain)", t.Table, t.Chain))
				continue
			}
			out = append(out, fmt.Sprintf("firewall chain %s/%s: %v", t.Table, t.Chain, err))
		}
	}
	return out
}

// Actions describes what Open and the later Close of from will do.
func (f *Firewall) Actions(from, to tunnelport.Port) (prepare, finalize []string) {
	for _, r := range f.Rules(to) {
		prepare = append(prepare, fmt.Sprintf("iptables -t %s %s", r.Table, r))
	}
	for _, r := range f.Rules(from) {
		finalize = append(finalize, fmt.Sprintf("iptables -t %s -D%s", r.Table, r.String()[2:]))
	}
	return prepare, finalize
}

// KeepComment marks the rules the agent adds on its own to keep the
// overlay's current port open (KeepOpen): a node that rebooted or joined
// after a cutover, behind a default-deny firewall, has no rule for the port
// the overlay now uses (Prepare opened it on the nodes of that operation,
// and a reboot lost it). The mark is what lets the agent, Finalize and
// `cutover-agent cleanup` remove only these and never a rule someone else
// wrote; it has no spaces, so iptables-save prints it bare.
const KeepComment = "cutover-keep-overlay-port"

// keepRule is template t for port, marked as kept by the agent.
func keepRule(t iptables.Rule, port tunnelport.Port) iptables.Rule {
	t.DPort, t.Comment = uint16(port), KeepComment
	return t
}

// Kept is what KeepOpen found and did, as iptables-save lines.
type Kept struct {
	Port    tunnelport.Port
	Found   []string // the port's rules already there (Prepare's, an operator's, the SDN's, or ours)
	Opened  []string // marked rules added now
	Removed []string // marked rules of other ports removed now
}

// KeepOpen makes sure port is open: for each template, when the plain rule
// (the form Prepare writes) or the marked one is installed, nothing is
// added; else the marked rule is (with its chain and jump, as Open does,
// when CreateChain). With removeStale, the marked rules of other ports go:
// the overlay left them (callers pass it only when no operation is in
// flight, whose undo may go back to such a port). Rules without the mark
// are never removed. A nil *Firewall keeps nothing.
func (f *Firewall) KeepOpen(port tunnelport.Port, removeStale bool) (Kept, error) {
	k := Kept{Port: port}
	if f == nil {
		return k, nil
	}
	for _, t := range f.Templates {
		plain, mark := t, keepRule(t, port)
		plain.DPort = uint16(port)
		found := false
		for _, r := range []iptables.Rule{plain, mark} {
			ok, err := f.IPT.HasRule(r)
			if err != nil && !iptables.IsNotFound(err) {
				return k, fmt.Errorf("firewall: check %s: %w", r, err)
			}
			if ok {
				k.Found = append(k.Found, r.String())
				found = true
				break
			}
		}
		if !found {
			if f.CreateChain {
				if err := f.IPT.EnsureChain(t.Table, t.Chain); err != nil {
					return k, fmt.Errorf("firewall: create chain %s/%s: %w", t.Table, t.Chain, err)
				}
				if f.JumpFrom != "" && t.Table == "filter" && t.Chain != f.JumpFrom {
					if err := f.IPT.EnsureJump(t.Table, f.JumpFrom, t.Chain); err != nil {
						return k, fmt.Errorf("firewall: jump from %s to %s/%s: %w", f.JumpFrom, t.Table, t.Chain, err)
					}
				}
			}
			if err := f.IPT.EnsureRule(mark); err != nil {
				return k, fmt.Errorf("firewall: keep port %d open: %s: %w", port, mark, err)
			}
			k.Opened = append(k.Opened, mark.String())
		}
	}
	if removeStale {
		removed, err := f.removeMarked(port)
		k.Removed = removed
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// RemoveKept removes every marked rule KeepOpen added, whatever its port
// (cleanup: the node is leaving Cutover), and returns them.
func (f *Firewall) RemoveKept() ([]string, error) {
	if f == nil {
		return nil, nil
	}
	return f.removeMarked(0)
}

var dportRE = regexp.MustCompile(`--dport (\d+)\b`)

// removeMarked deletes the marked rules of every port but except (0: all)
// from the templates' chains. A rule is removed only when it is, byte for
// byte, a template with the mark for its port.
func (f *Firewall) removeMarked(except tunnelport.Port) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, t := range f.Templates {
		if seen[t.Table+"/"+t.Chain] {
			continue
		}
		lines, err := f.IPT.ListRules(t.Table, t.Chain)
		if iptables.IsNotFound(err) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("firewall: list %s/%s: %w", t.Table, t.Chain, err)
		}
		seen[t.Table+"/"+t.Chain] = true
		for _, l := range lines {
			m := dportRE.FindStringSubmatch(l)
			if m == nil || !strings.Contains(l, KeepComment) {
				continue
			}
			p, err := strconv.ParseUint(m[1], 10, 16)
			if err != nil || tunnelport.Port(p) == except {
				continue
			}
			for _, tt := range f.Templates {
				if tt.Table != t.Table || tt.Chain != t.Chain {
					continue
				}
				if r := keepRule(tt, tunnelport.Port(p)); r.String() == strings.TrimSpace(l) {
					if err := f.IPT.DeleteRule(r); err != nil {
						return out, fmt.Errorf("firewall: remove %s: %w", r, err)
					}
					out = append(out, r.String())
				}
			}
		}
	}
	return out, nil
}
