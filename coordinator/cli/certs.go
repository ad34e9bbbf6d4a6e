package cli

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cutover-dev/cutover/pkg/pki"
)

// maxValidity bounds --validity: these are lab certificates; a decade is a
// typo or a certificate nobody will ever rotate.
const maxValidity = 10 * 365 * 24 * time.Hour

func newCertsCmd(g *Globals) *cobra.Command {
	var (
		dir      string
		agents   []string
		coordIPs []string
		validity time.Duration
	)
	cmd := &cobra.Command{
		Use:   "certs --dir D --agent name=ip[,name=ip...] [--coordinator-ip ip] [--validity 720h]",
		Short: "Create a lab CA and certificates for the coordinator, coordctl and each agent",
		Long: `Create a lab PKI in --dir: ca.pem and ca-key.pem, coordinator.pem (role
coordinator), admin.pem (role admin, for coordctl) and agent-<name>.pem per
--agent (role agent; SANs: the name, 127.0.0.1 and the given IPs). Keys are
ECDSA P-256, written 0600. When --dir already holds a CA it is reused, so
agents can be added later. Talks to no coordinator.

Then: coordctl --tls-dir D agents; the coordinator takes --tls-ca D/ca.pem
--tls-cert D/coordinator.pem --tls-key D/coordinator-key.pem, each agent its
agent-<name>.pem and agent-<name>-key.pem.

Exit codes: 0 written, 2 bad input, 1 could not write.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return usageError("--dir is required: the directory to write the CA and certificates into")
			}
			ids, err := parseAgentFlags(agents)
			if err != nil {
				return err
			}
			cips, err := parseIPs("--coordinator-ip", coordIPs)
			if err != nil {
				return err
			}
			if validity <= 0 || validity > maxValidity {
				return usageError("--validity %s: want more than 0 and at most %s (e.g. 720h)", validity, maxValidity)
			}
			opts := pki.IssueOptions{Agents: ids, CoordinatorIPs: cips, Validity: validity}
			if err := opts.Validate(); err != nil {
				return &ExitError{Code: ExitUsage, Err: err}
			}
			if err := pki.Issue(dir, opts); err != nil {
				return &ExitError{Code: ExitFailed, Err: err}
			}
			w := g.Stdout
			_, _ = fmt.Fprintf(w, "wrote a lab PKI to %s (valid %s):\n", dir, validity)
			show := func(who string, f pki.Files) { _, _ = fmt.Fprintf(w, "  %-22s %s  %s\n", who, f.Cert, f.Key) }
			_, _ = fmt.Fprintf(w, "  %-22s %s\n", "CA", pki.AdminFiles(dir).CA)
			show("coordinator", pki.CoordinatorFiles(dir))
			show("admin (coordctl)", pki.AdminFiles(dir))
			for _, a := range ids {
				show("agent "+a.Name, pki.AgentFiles(dir, a.Name))
			}
			_, _ = fmt.Fprintf(w, "use: coordctl --tls-dir %s agents\n", dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write into (created 0700; an existing CA in it is reused)")
	f.StringArrayVar(&agents, "agent", nil, "agent identities as name=ip[,name=ip...] (repeatable; name alone: 127.0.0.1 only)")
	f.StringArrayVar(&coordIPs, "coordinator-ip", nil, "extra IP SANs of the coordinator, comma-separated (repeatable)")
	f.DurationVar(&validity, "validity", 720*time.Hour, "validity of the CA and every certificate")
	return cmd
}

func parseAgentFlags(vals []string) ([]pki.AgentIdentity, error) {
	var out []pki.AgentIdentity
	idx := map[string]int{}
	for _, v := range vals {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			name, ipStr, hasIP := strings.Cut(item, "=")
			if name == "" {
				return nil, usageError("--agent %q: an entry has no name: want name=ip[,name=ip...]", v)
			}
			if !dnsSubdomain.MatchString(name) || len(name) > 253 {
				return nil, usageError("--agent %q: %q is not a node name (lower-case letters, digits, '-' and '.')", v, name)
			}
			i, ok := idx[name]
			if !ok {
				i = len(out)
				idx[name] = i
				out = append(out, pki.AgentIdentity{Name: name})
			}
			if hasIP {
				ip := net.ParseIP(ipStr)
				if ip == nil || ip.IsUnspecified() {
					return nil, usageError("--agent %q: %q is not a usable IP address for %s", v, ipStr, name)
				}
				out[i].IPs = append(out[i].IPs, ip)
			}
		}
	}
	if len(out) == 0 {
		return nil, usageError("--agent: none given: name at least one agent, e.g. --agent n1=198.18.0.1")
	}
	return out, nil
}

func parseIPs(flag string, vals []string) ([]net.IP, error) {
	var out []net.IP
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			ip := net.ParseIP(strings.TrimSpace(s))
			if ip == nil || ip.IsUnspecified() {
				return nil, usageError("%s %q: %q is not a usable IP address", flag, v, s)
			}
			out = append(out, ip)
		}
	}
	return out, nil
}
