package dataplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/nftables"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// What the firewall does about native nftables chains that drop the port
// whatever iptables accepts (pkg/nftables explains why they exist).
const (
	// NFTOpen inserts an accept of the port at the top of each such chain
	// (comment cutover-open-udp-PORT) and removes it when the port closes.
	NFTOpen = "open"
	// NFTRefuse refuses preflight and Prepare, naming the chains.
	NFTRefuse = "refuse"
	// NFTIgnore does not look (a host known to have no native tables, or
	// no nft binary).
	NFTIgnore = "ignore"
)

// NFTModes lists the valid modes.
var NFTModes = []string{NFTOpen, NFTRefuse, NFTIgnore}

// firewalldTable is the table firewalld (0.6+, nftables backend) owns. It
// rebuilds the table on every reload, so a rule written into it lasts only
// until the next `firewall-cmd --reload`: the agent refuses instead and
// says which firewall-cmd opens the port for good.
const firewalldTable = "firewalld"

const nftTimeout = 30 * time.Second

func (f *Firewall) nftOn() bool {
	return f != nil && f.NFT != nil && f.NFTMode != NFTIgnore && !f.skipNFT
}

func (f *Firewall) owned() nftables.Owned {
	if f.IPT != nil && f.IPT.Backend() == iptables.BackendNFT {
		return nftables.IptablesNFTOwned
	}
	return nftables.NoneOwned
}

// nftBlockers reads the ruleset and lists the chains that would drop port,
// split into those the agent opens and those it refuses, with the refusal
// text for each.
func (f *Firewall) nftBlockers(ctx context.Context, port tunnelport.Port) (rs *nftables.Ruleset, open []nftables.Blocker, refuse []string, err error) {
	rs, err = f.NFT.Ruleset(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("firewall: %w (is nft installed? --nftables=%s skips the check on a host without native nftables tables)", err, NFTIgnore)
	}
	for _, b := range rs.Blockers(f.owned(), uint16(port)) {
		switch {
		case b.Table == firewalldTable:
			refuse = append(refuse, fmt.Sprintf("nftables %s drops UDP %d whatever iptables accepts, and firewalld rewrites that table on every reload, so the agent does not write into it: open the port in firewalld on every node (firewall-cmd --permanent --add-port=%d/udp && firewall-cmd --reload, in the zone of the node's underlay interface), then plan again", b, port, port))
		case f.NFTMode == NFTRefuse:
			refuse = append(refuse, fmt.Sprintf("nftables %s drops UDP %d whatever iptables accepts: accept it there (nft insert rule %s %s %s udp dport %d accept, and in the file that loads the table), or run the agent with --nftables=%s", b, port, b.Family, b.Table, b.Chain, port, NFTOpen))
		default:
			open = append(open, b)
		}
	}
	return rs, open, refuse, nil
}

func opening(b nftables.Blocker, port tunnelport.Port) nftables.Opening {
	return nftables.Opening{Family: b.Family, Table: b.Table, Chain: b.Chain, Port: uint16(port)}
}

// NFTCheck is the preflight of the native nftables side: problems that
// stop Open (a chain it refuses to write into, an unreadable ruleset), the
// rules Prepare will insert and those Finalize will delete.
func (f *Firewall) NFTCheck(from, to tunnelport.Port) (problems, prepare, finalize []string) {
	if !f.nftOn() {
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	rs, open, refuse, err := f.nftBlockers(ctx, to)
	if err != nil {
		return []string{err.Error()}, nil, nil
	}
	for _, b := range open {
		prepare = append(prepare, opening(b, to).String()+"  ("+b.String()+")")
	}
	for _, o := range rs.OursAnywhere(uint16(from)) {
		finalize = append(finalize, fmt.Sprintf("nft delete rule %s %s %s handle … (comment %s)", o.Family, o.Table, o.Chain, nftables.Comment(uint16(from))))
	}
	return refuse, prepare, finalize
}

// openNFT runs before any iptables change: a refusal leaves the node as
// it was.
func (f *Firewall) openNFT(port tunnelport.Port) error {
	if !f.nftOn() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	rs, open, refuse, err := f.nftBlockers(ctx, port)
	if err != nil {
		return err
	}
	if len(refuse) > 0 {
		return fmt.Errorf("firewall: not opening port %d, nothing changed: %s", port, strings.Join(refuse, "; "))
	}
	for _, b := range open {
		if err := f.NFT.Insert(ctx, rs, opening(b, port)); err != nil {
			return fmt.Errorf("firewall: %w", err)
		}
	}
	return nil
}

// closeNFT deletes the openings of port this package wrote, except those
// keyed in keep.
func (f *Firewall) closeNFT(port tunnelport.Port, keep map[string]bool) error {
	if !f.nftOn() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	rs, err := f.NFT.Ruleset(ctx)
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	var errs []error
	for _, o := range rs.OursAnywhere(uint16(port)) {
		if keep[o.String()] {
			continue
		}
		errs = append(errs, f.NFT.Delete(ctx, rs, o))
	}
	return errors.Join(errs...)
}

// presentNFT adds the openings of port already in the ruleset to present.
func (f *Firewall) presentNFT(port tunnelport.Port, present map[string]bool) error {
	if !f.nftOn() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	rs, err := f.NFT.Ruleset(ctx)
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	for _, o := range rs.OursAnywhere(uint16(port)) {
		present[o.String()] = true
	}
	return nil
}
