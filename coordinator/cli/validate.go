package cli

import (
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// targetFlags are the flags plan and cutover share. Port is a string on
// purpose: pflag's uint parser says `strconv.ParseUint: parsing "48x9":
// invalid syntax`, which names neither the field's meaning nor the range.
type targetFlags struct {
	port               string
	nodes              string
	selector           string
	allowNodePortRange bool
	allowTunnelPort    bool
	allowUnprobed      bool
	allowPathProblems  bool
	strategy           string
	batches            string
	maxParallel        int
}

func (t *targetFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.port, "port", "", "the new VXLAN UDP port, 1-65535 (required)")
	f.StringVar(&t.nodes, "nodes", "", "only these nodes, comma-separated (default: all)")
	f.StringVar(&t.selector, "selector", "", "only nodes with these labels, k=v[,k=v]")
	f.BoolVar(&t.allowNodePortRange, "allow-nodeport-range", false, "allow a port inside the Kubernetes NodePort range")
	f.BoolVar(&t.allowTunnelPort, "allow-tunnel-port", false, "allow another tunnel's well-known port (Geneve 6081, flannel 8472)")
	f.BoolVar(&t.allowUnprobed, "allow-unprobed", false, "accept nodes without a probe address: left out of the probe mesh, the result is flagged (exit 7), never a clean success")
	f.BoolVar(&t.allowPathProblems, "allow-path-problems", false, "go ahead although the underlay path check found problems (blocked pairs, VNI drops, MTU) on the new port: the result is flagged (exit 7), never a clean success")
	f.StringVar(&t.strategy, "strategy", "", `unset: the coordinator's --default-strategy (auto, unless it is set to atomic); "atomic": every node flips at one instant; "staged": every node listens on both ports, senders switch in batches with the probe mesh verified after each, then the old port is retired (docs/staged.md); "auto": staged where every node accepts it and its agent says staged loses less there, else atomic (the report says which and why)`)
	f.StringVar(&t.batches, "batches", "", `staged only: cumulative batch sizes, a node count or a percentage, e.g. 1,10%,100% (default 1,100%: a canary, then the rest)`)
	f.IntVar(&t.maxParallel, "max-parallel", 0, `staged only: at most this many nodes listen, switch or retire at a time (0: a tenth of the nodes, rounded up)`)
}

// request validates the flags and builds the request. Every error names
// the flag, the value and the reason.
func (t *targetFlags) request() (*coordinatorv1.CutoverRequest, error) {
	port, err := parsePort(t.port)
	if err != nil {
		return nil, err
	}
	req := &coordinatorv1.CutoverRequest{
		Port:               port,
		AllowNodeportRange: t.allowNodePortRange,
		AllowTunnelPort:    t.allowTunnelPort,
		AllowUnprobed:      t.allowUnprobed,
		AllowPathProblems:  t.allowPathProblems,
	}
	switch t.strategy {
	case "":
	case "atomic", "staged", "auto":
		req.Strategy = t.strategy
	default:
		return nil, usageError("--strategy %q: want atomic (every node at one instant), staged (listen on both, switch senders in batches, retire) or auto (staged where it loses less, else atomic)", t.strategy)
	}
	if t.batches != "" {
		if t.strategy != "staged" {
			return nil, usageError("--batches %q: only --strategy staged switches in batches", t.batches)
		}
		for i, b := range strings.Split(t.batches, ",") {
			b = strings.TrimSpace(b)
			if b == "" {
				return nil, usageError("--batches %q: batch %d is empty (stray comma?)", t.batches, i+1)
			}
			req.Batches = append(req.Batches, b)
		}
	}
	if t.maxParallel != 0 {
		switch {
		case t.strategy != "staged":
			return nil, usageError("--max-parallel %d: only --strategy staged changes nodes in waves (atomic: every node at one instant)", t.maxParallel)
		case t.maxParallel < 0:
			return nil, usageError("--max-parallel %d: want 1 or more (0: a tenth of the nodes)", t.maxParallel)
		}
		req.MaxParallel = uint32(t.maxParallel)
	}
	if t.nodes != "" && t.selector != "" {
		return nil, usageError("--nodes %q and --selector %q together: choose nodes by name or by label, not both", t.nodes, t.selector)
	}
	if t.nodes != "" {
		if req.Nodes, err = parseNodes(t.nodes); err != nil {
			return nil, err
		}
	}
	if t.selector != "" {
		if err := validateSelector(t.selector); err != nil {
			return nil, err
		}
		req.Selector = t.selector
	}
	return req, nil
}

func parsePort(s string) (uint32, error) {
	if s == "" {
		return 0, usageError("--port is required: the new VXLAN UDP port, 1-65535 (e.g. --port 4889)")
	}
	p, err := tunnelport.Parse("--port", s)
	if err != nil {
		return 0, usageError("%s", err)
	}
	return uint32(p), nil
}

var (
	// DNS-1123 subdomain: Kubernetes node names.
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// The name part of a label key, and a label value (Kubernetes rules).
	labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

func parseNodes(s string) ([]string, error) {
	parts := strings.Split(s, ",")
	seen := map[string]bool{}
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
			return nil, usageError("--nodes %q: node name %d of %d is empty (stray comma?)", s, i+1, len(parts))
		case len(p) > 253 || !dnsSubdomain.MatchString(p):
			return nil, usageError("--nodes %q: %q is not a node name (lower-case letters, digits, '-' and '.', at most 253)", s, p)
		case seen[p]:
			return nil, usageError("--nodes %q: %q given twice", s, p)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}

// validateSelector accepts only equality selectors k=v[,k=v] with
// Kubernetes label key and value syntax: the coordinator matches nothing
// else, and a set-based selector silently matching no node would be worse
// than an error.
func validateSelector(s string) error {
	seen := map[string]bool{}
	for _, term := range strings.Split(s, ",") {
		if strings.Contains(term, "!=") || strings.Contains(term, "==") || strings.ContainsAny(term, "()!") || strings.Contains(term, " in ") || strings.Contains(term, " notin ") {
			return usageError("--selector %q: term %q: only k=v equality terms are supported, joined by commas", s, term)
		}
		k, v, ok := strings.Cut(term, "=")
		if !ok {
			return usageError("--selector %q: term %q has no '=': want k=v[,k=v]", s, term)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if reason := labelKeyProblem(k); reason != "" {
			return usageError("--selector %q: label key %q %s", s, k, reason)
		}
		if v != "" && (len(v) > 63 || !labelName.MatchString(v)) {
			return usageError("--selector %q: label value %q is invalid: at most 63 of letters, digits, '-', '_', '.', beginning and ending with a letter or digit", s, v)
		}
		if seen[k] {
			return usageError("--selector %q: label key %q given twice", s, k)
		}
		seen[k] = true
	}
	return nil
}

func labelKeyProblem(k string) string {
	if k == "" {
		return "is empty"
	}
	name := k
	if prefix, n, ok := strings.Cut(k, "/"); ok {
		if prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix) {
			return "has an invalid prefix: it must be a DNS subdomain like example.com/"
		}
		name = n
	}
	if name == "" || len(name) > 63 || !labelName.MatchString(name) {
		return "is invalid: the name part must be 1-63 of letters, digits, '-', '_', '.', beginning and ending with a letter or digit"
	}
	return ""
}

// opID is the coordinator's own rule for operation ids.
var opID = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$`)

// optionalOpID validates the optional OP argument of status and rollback.
func optionalOpID(args []string) (string, error) {
	if len(args) == 0 {
		return "", nil
	}
	if !opID.MatchString(args[0]) {
		return "", usageError("operation id %q: want 1-64 of letters, digits, '.', '_', '-', starting with a letter or digit (as printed by coordctl cutover/status)", args[0])
	}
	return args[0], nil
}
