package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/spf13/pflag"
)

func TestDefaultsAreValidWithTLS(t *testing.T) {
	dir := t.TempDir()
	cfg := Default()
	cfg.NodeName = "node-1"
	for _, f := range []*string{&cfg.TLS.CA, &cfg.TLS.Cert, &cfg.TLS.Key} {
		*f = filepath.Join(dir, "x.pem")
	}
	os.WriteFile(cfg.TLS.CA, []byte("x"), 0o600)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults + TLS files: %v", err)
	}
	if cfg.ListenAddr != ":9443" || cfg.MetricsAddr != ":9444" || cfg.StateDir != "/var/lib/cutover" ||
		cfg.OVSDB != "unix:/var/run/openvswitch/db.sock" || cfg.Bridge != "br0" || cfg.Interface != "vxlan0" ||
		cfg.KernelDevice != "flannel.1" || cfg.FirewallChain != "OS_FIREWALL_ALLOW" || cfg.FirewallTable != "filter" ||
		cfg.IptablesBackend != "auto" || cfg.PrepareTimeout != 5*time.Minute {
		t.Fatalf("defaults changed: %+v", cfg)
	}
}

// TestValidateNamesFlagValueReason feeds one bad value at a time and
// checks the error names the flag, the value and says why.
func TestValidateNamesFlagValueReason(t *testing.T) {
	cases := []struct {
		args []string
		flag string
		want string // part of the reason
	}{
		{[]string{"--node-name", "Node_1"}, "node-name", "DNS-1123"},
		{[]string{"--node-name", ""}, "node-name", "empty"},
		{[]string{"--underlay-address", "198.18.0.300"}, "underlay-address", "not a unicast IPv4"},
		{[]string{"--underlay-address", "fd00::1"}, "underlay-address", "not a unicast IPv4"},
		{[]string{"--overlay-vnis", "16777216"}, "overlay-vnis", "not a VNI"},
		{[]string{"--overlay-mtu", "100"}, "overlay-mtu", "576-"},
		{[]string{"--listen", "9443"}, "listen", "not host:port"},
		{[]string{"--listen", ":99999"}, "listen", "0-65535"},
		{[]string{"--metrics-listen", ":9443"}, "metrics-listen", "same address as --listen"},
		{[]string{"--state-dir", "relative/dir"}, "state-dir", "absolute"},
		{[]string{"--backend", "geneve"}, "backend", "want ovs or kernel-vxlan"},
		{[]string{"--ovsdb", "/var/run/db.sock"}, "ovsdb", "unix:/path or tcp:host:port"},
		{[]string{"--ovsdb", "unix:db.sock"}, "ovsdb", "absolute"},
		{[]string{"--bridge", "a-very-long-bridge-name"}, "bridge", "15-character"},
		{[]string{"--interface", "vx/lan"}, "interface", "not a valid interface name"},
		{[]string{"--backend", "kernel-vxlan", "--kernel-device", ""}, "kernel-device", "empty"},
		{[]string{"--firewall-chain", "A-CHAIN-NAME-LONGER-THAN-28-CHARS"}, "firewall-chain", "28-character"},
		{[]string{"--firewall-chain", "bad chain"}, "firewall-chain", "only letters"},
		{[]string{"--firewall-table", "filtre"}, "firewall-table", "unknown iptables table"},
		{[]string{"--iptables-backend", "xtables"}, "iptables-backend", "auto, nft, legacy"},
		{[]string{"--nftables", "drop"}, "nftables", "open, refuse, ignore"},
		{[]string{"--tls-ca", ""}, "tls-ca", "required"},
		{[]string{"--tls-cert", "/nonexistent/cert.pem"}, "tls-cert", "no such file"},
		{[]string{"--insecure", "--tls-key", "/k.pem"}, "tls-key", "together with --insecure"},
		{[]string{"--labels", "zone=a b"}, "labels", "not a valid label value"},
		{[]string{"--labels", "-zone=a"}, "labels", "not a valid label key"},
		{[]string{"--deadman", "0s"}, "deadman", "positive"},
		{[]string{"--deadman", "2h"}, "deadman", "longer than --max-deadman"},
		{[]string{"--prepare-timeout", "-1s"}, "prepare-timeout", "positive"},
		{[]string{"--log-level", "loud"}, "log-level", "debug, info, warn, error"},
	}
	dir := t.TempDir()
	pem := filepath.Join(dir, "x.pem")
	os.WriteFile(pem, []byte("x"), 0o600)
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			cfg := Default()
			cfg.NodeName = "node-1"
			cfg.TLS.CA, cfg.TLS.Cert, cfg.TLS.Key = pem, pem, pem
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			cfg.AddFlags(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if cfg.Insecure {
				cfg.TLS.CA, cfg.TLS.Cert = "", ""
			}
			err := cfg.Validate()
			var fe *FlagError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate = %v, want a *FlagError", err)
			}
			if !strings.Contains(err.Error(), "--"+c.flag+" ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %q, want it to name --%s and say %q", err, c.flag, c.want)
			}
			if strings.Count(err.Error(), "\n") != 0 {
				t.Fatalf("one bad value gave several errors: %q", err)
			}
		})
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	cfg := Default()
	cfg.NodeName = "n"
	cfg.Insecure = true
	cfg.Backend = "x"
	cfg.FirewallTable = "y"
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "--backend") || !strings.Contains(err.Error(), "--firewall-table") {
		t.Fatalf("Validate = %v, want both problems", err)
	}
}

func TestLabelsFlag(t *testing.T) {
	cfg := Default()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--labels", "zone=a,topology.kubernetes.io/region=eu-1"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Labels["zone"] != "a" || cfg.Labels["topology.kubernetes.io/region"] != "eu-1" {
		t.Fatalf("labels = %v", cfg.Labels)
	}
	cfg.NodeName, cfg.Insecure = "n", true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestNewBackendUnknown(t *testing.T) {
	cfg := Default()
	cfg.Backend = "geneve"
	if _, err := NewBackend(cfg); err == nil || !strings.Contains(err.Error(), `--backend "geneve"`) {
		t.Fatalf("NewBackend(geneve) = %v", err)
	}
}

// An OVS backend whose ovsdb-server is absent builds (OVS may start after
// the agent) and says in its readiness what is missing.
func TestNewBackendOVSWithoutServerIsNotReady(t *testing.T) {
	testenv.RequirePrivileged(t, "iptables")
	cfg := Default()
	cfg.Backend = BackendOVS
	cfg.OVSDB = "unix:" + t.TempDir() + "/absent.sock"
	b, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nr := b.Ready(ctx)
	if len(nr) == 0 || !strings.Contains(nr[0], "ovsdb") {
		t.Fatalf("Ready = %v, want an ovsdb problem", nr)
	}
}

func TestProfileValidated(t *testing.T) {
	cfg := Default()
	cfg.NodeName, cfg.Insecure = "n", true
	cfg.Profile = ProfileOpenShiftSDN
	if err := cfg.Validate(); err != nil {
		t.Fatalf("openshift-sdn on the ovs backend: %v", err)
	}
	cfg.Backend = BackendKernelVXLAN
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--profile") {
		t.Fatalf("openshift-sdn on kernel-vxlan: %v, want an error naming --profile", err)
	}
	cfg.Backend, cfg.Profile = BackendOVS, "calico"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `--profile "calico"`) {
		t.Fatalf("unknown profile: %v", err)
	}
}

// TestStandingRedirectsValidated: the standing redirects are OpenFlow
// flows for the staged strategy, so only the ovs backend without the
// openshift-sdn profile takes them; the error names the flag and why.
func TestStandingRedirectsValidated(t *testing.T) {
	cfg := Default()
	cfg.NodeName, cfg.Insecure = "n", true
	cfg.StandingRedirects = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("standing redirects on the ovs backend: %v", err)
	}
	for _, c := range []struct {
		backend, profile, why string
	}{
		{BackendKernelVXLAN, ProfileNone, "needs --backend ovs"},
		{BackendOVS, ProfileOpenShiftSDN, "the SDN owns br0's flows"},
	} {
		cfg.Backend, cfg.Profile = c.backend, c.profile
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), `--ovs-standing-redirects "true"`) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s %q: %v, want an error naming --ovs-standing-redirects and %q", c.backend, c.profile, err, c.why)
		}
	}
}
