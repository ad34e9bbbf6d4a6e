package dataplane

import (
	"fmt"

	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/nftables"
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
func (f *Firewall) Rules(port uint16) []iptables.Rule {
	if f == nil {
		return nil
	}
	out := make([]iptables.Rule, len(f.Templates))
	for i, t := range f.Templates {
		t.DPort = port
		out[i] = t
	}
	return out
}

// Present returns, for each rule of port, whether it is installed, keyed by
// the rule's iptables-save line.
func (f *Firewall) Present(port uint16) (map[string]bool, error) {
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
func (f *Firewall) Open(port uint16) error {
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
func (f *Firewall) Close(port uint16, keep map[string]bool) error {
	for _, r := range f.Rules(port) {
		if keep[r.String()] {
			continue
		}
		if err := f.IPT.DeleteRule(r); err != nil {
			return fmt.Errorf("firewall: close %s: %w", r, err)
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
func (f *Firewall) Actions(from, to uint16) (prepare, finalize []string) {
	for _, r := range f.Rules(to) {
		prepare = append(prepare, fmt.Sprintf("iptables -t %s %s", r.Table, r))
	}
	for _, r := range f.Rules(from) {
		finalize = append(finalize, fmt.Sprintf("iptables -t %s -D%s", r.Table, r.String()[2:]))
	}
	return prepare, finalize
}
