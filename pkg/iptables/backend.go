package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Backends. A node uses one of them; rules written with the other live in a
// separate kernel table set that the CNI and iptables-save never show.
const (
	BackendNFT    = "nft"
	BackendLegacy = "legacy"
	BackendAuto   = "auto"
)

// Detection is what Detect saw, so the choice can be logged and explained.
type Detection struct {
	Backend     string
	LegacyRules int    // "-A" lines in iptables-legacy-save
	NFTRules    int    // "-A" lines in iptables-nft-save
	Default     string // backend of the system's `iptables`, when consulted
	Reason      string
}

// Detect picks the backend the node already uses, with the heuristic of
// kubernetes-sigs/iptables-wrappers: the backend holding more rules wins,
// because the CNI and kube-proxy have written theirs there. With no rules in
// either (or a tie), the backend `iptables` points to by default wins, as
// `iptables --version` says "(nf_tables)" or "(legacy)". A missing *-save
// binary counts as zero rules; only IPv4 is counted (the overlay is IPv4).
// Detection only reads (the *-save commands and --version), through run,
// the exec seam; nil runs the real commands. They run on the calling OS
// thread, and so inside whatever network namespace it is in (netns.Do).
func Detect(ctx context.Context, run execseam.Func) (Detection, error) {
	if run == nil {
		run = execseam.Exec
	}
	var d Detection
	legacy, lerr := run(ctx, []string{"iptables-legacy-save"}, nil)
	nft, nerr := run(ctx, []string{"iptables-nft-save"}, nil)
	if lerr != nil && nerr != nil {
		return d, fmt.Errorf("iptables: detect backend: neither save command works: %w", errors.Join(lerr, nerr))
	}
	d.LegacyRules, d.NFTRules = countRules(legacy), countRules(nft)
	switch {
	case nerr != nil:
		d.Backend, d.Reason = BackendLegacy, "iptables-nft-save failed: "+nerr.Error()
		return d, nil
	case lerr != nil:
		d.Backend, d.Reason = BackendNFT, "iptables-legacy-save failed: "+lerr.Error()
		return d, nil
	case d.LegacyRules > d.NFTRules:
		d.Backend, d.Reason = BackendLegacy, fmt.Sprintf("legacy holds more rules (%d > %d)", d.LegacyRules, d.NFTRules)
		return d, nil
	case d.NFTRules > d.LegacyRules:
		d.Backend, d.Reason = BackendNFT, fmt.Sprintf("nft holds more rules (%d > %d)", d.NFTRules, d.LegacyRules)
		return d, nil
	}
	out, err := run(ctx, []string{"iptables", "--version"}, nil)
	if err != nil {
		return d, fmt.Errorf("iptables: detect backend: both backends hold %d rules and the default is unknown: %w", d.NFTRules, err)
	}
	d.Default = defaultFromVersion(string(out))
	d.Backend = d.Default
	d.Reason = fmt.Sprintf("both backends hold %d rules; system default %q", d.NFTRules, strings.TrimSpace(string(out)))
	return d, nil
}

// countRules counts rule lines in *-save output; chain headers start with
// ':' and comments (like nft's "legacy tables present" warning) with '#'.
func countRules(save []byte) int {
	n := 0
	for _, l := range strings.Split(string(save), "\n") {
		if strings.HasPrefix(l, "-A ") {
			n++
		}
	}
	return n
}

// defaultFromVersion reads `iptables --version`: "iptables v1.8.9
// (nf_tables)" or "(legacy)"; before 1.8 no mode is printed and only legacy
// existed.
func defaultFromVersion(v string) string {
	if strings.Contains(v, "(nf_tables)") {
		return BackendNFT
	}
	return BackendLegacy
}

// Binary is the iptables binary of a backend.
func Binary(backend string) string { return "iptables-" + backend }

func validBackend(b string) error {
	switch b {
	case BackendNFT, BackendLegacy, BackendAuto:
		return nil
	}
	return &ValidationError{"backend", b, `must be "nft", "legacy" or "auto"`}
}

const defaultLockWait = 10 * time.Second
