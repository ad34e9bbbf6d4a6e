// Package agent is the per-node Cutover agent: it serves the AgentService
// gRPC API (mTLS, coordinator role only) over the operation state machine
// and a dataplane backend, and /healthz, /readyz and /metrics.
//
// It owns the wiring (config, backend choice, servers, metrics); the
// operation logic lives in agent/operation and the dataplane behind
// agent/dataplane. It must not exec programs or speak netlink itself: that
// is the drivers' job in pkg/.
package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/probe"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
	"github.com/cutover-dev/cutover/pkg/pki"
)

// Backend names.
const (
	BackendOVS         = "ovs"
	BackendKernelVXLAN = "kernel-vxlan"
)

// Profiles: what of a CNI's own state the agent keeps in step with the
// port besides the tunnel itself.
const (
	ProfileNone         = ""
	ProfileOpenShiftSDN = "openshift-sdn"
)

// Config is everything the agent is started with.
type Config struct {
	NodeName    string // identity reported to the coordinator; default: hostname
	ListenAddr  string // gRPC AgentService
	MetricsAddr string // /healthz, /readyz, /metrics (plain HTTP)
	StateDir    string // durable operation record

	Backend string // BackendOVS or BackendKernelVXLAN
	// Profile adds a CNI's port-bound state to the change: with
	// ProfileOpenShiftSDN the SDN's OPENSHIFT-FIREWALL-ALLOW and raw
	// OPENSHIFT-NOTRACK rules and br0's drop flow (ovs backend only).
	Profile string

	// OVS backend.
	OVSDB     string // unix:/path or tcp:host:port
	Bridge    string
	Interface string
	// StandingRedirects keeps the staged strategy's two redirect flows on
	// the bridge between operations, so that a staged operation changes
	// no flow table (docs/staged.md, "How each backend does it": standing redirects).
	StandingRedirects bool

	// Kernel VXLAN backend.
	KernelDevice string
	// ConntrackCleanup deletes the conntrack entries of the port a kernel
	// VXLAN device leaves (narrowly: UDP, that destination port).
	ConntrackCleanup bool

	// Firewall opening of the new port (both backends).
	FirewallChain   string
	FirewallTable   string
	CreateChain     bool // create the chain when missing (else it must exist)
	StateNewMatch   bool // match -m state --state NEW like openshift-sdn's rules
	IptablesBackend string
	// NFTables says what to do about native nftables input chains that
	// would drop the port whatever iptables accepts: open | refuse | ignore
	// (agent/dataplane NFTOpen…).
	NFTables string

	TLS pki.Files
	// Insecure serves plain gRPC with no peer authentication: local labs
	// only. Every start logs a loud warning.
	Insecure bool

	Labels map[string]string

	Deadman        time.Duration // when Commit does not say
	MaxDeadman     time.Duration // upper bound for a Commit's dead-man
	PrepareTimeout time.Duration // abort a prepared op nobody commits or rolls back
	MaxCommitDelay time.Duration // how far in the future a commit instant may be
	CallTimeout    time.Duration // each backend call the agent makes on its own
	BackendRetry   time.Duration // retry building the backend while it fails

	LogLevel string // debug, info, warn, error

	// PortRefresh is how often the port is read back for the metric.
	PortRefresh time.Duration

	// Overlay probe mesh: UDP echo probes from this node's overlay address
	// to its peers', on by default. The address is, in order of
	// precedence: ProbeListen (ip:port, as the lab gives it), ProbeAddress
	// with ProbePort, or the first primary IPv4 of ProbeInterface (default
	// per backend: tun0 for ovs, the --kernel-device for kernel-vxlan)
	// with ProbePort, looked up until found. No address is no probing, not
	// a failure: Info says why.
	Probe          bool
	ProbeListen    string // overlay ip:port
	ProbeAddress   string // overlay IP
	ProbeInterface string // interface holding the overlay IP; "" = per backend
	ProbePort      int
	// ProbePeers is the static peer set, name=ip:port,... A Prepare that
	// names peers replaces it (the coordinator's sample wins).
	ProbePeers    string
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	// ProbeLinger is how long the coordinator's probe peers stay after the
	// operation that brought them ended (0: until the next Prepare).
	ProbeLinger time.Duration

	// Underlay path check (PathCheck, pathcheck.go). UnderlayAddress is
	// the node IP the overlay's tunnel sends from; empty: the --listen
	// host when it is an IP (the DaemonSet listens on status.hostIP).
	// OverlayVNIs are the VNIs an OVS key=flow overlay puts on the wire
	// (openshift-sdn multitenant: its netids); empty: 0, the netid of
	// every namespace under the networkpolicy and subnet plugins. A kernel
	// backend reports its device's VNI. OverlayMTU overrides the MTU read
	// from the dataplane (kernel device, or the overlay probe interface).
	UnderlayAddress string
	OverlayVNIs     []uint
	OverlayMTU      int
}

// DefaultProbePort is the UDP port of the probe mesh on the overlay address
// (the lab's too).
const DefaultProbePort = 9445

// DefaultOVSProbeInterface is the OVS backend's overlay gateway interface:
// openshift-sdn's tun0, holding the node's first pod-subnet address.
const DefaultOVSProbeInterface = "tun0"

// Default returns the defaults every flag starts from.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:         host,
		ListenAddr:       ":9443",
		MetricsAddr:      ":9444",
		StateDir:         "/var/lib/cutover",
		Backend:          BackendOVS,
		OVSDB:            "unix:/var/run/openvswitch/db.sock",
		Bridge:           "br0",
		Interface:        "vxlan0",
		KernelDevice:     "flannel.1",
		FirewallChain:    "OS_FIREWALL_ALLOW",
		FirewallTable:    "filter",
		CreateChain:      false,
		ConntrackCleanup: true,
		StateNewMatch:    true,
		IptablesBackend:  "auto",
		NFTables:         dataplane.NFTOpen,
		Labels:           map[string]string{},
		Deadman:          30 * time.Second,
		MaxDeadman:       time.Hour,
		PrepareTimeout:   5 * time.Minute,
		MaxCommitDelay:   10 * time.Minute,
		CallTimeout:      30 * time.Second,
		BackendRetry:     10 * time.Second,
		LogLevel:         "info",
		Probe:            true,
		ProbePort:        DefaultProbePort,
		ProbeInterval:    10 * time.Millisecond,
		PortRefresh:      5 * time.Second,
		ProbeTimeout:     200 * time.Millisecond,
		ProbeLinger:      10 * time.Minute,
	}
}

// AddFlags binds the config's fields to flags on fs; the values already in
// c are the defaults shown.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's name as the coordinator knows it")
	fs.StringVar(&c.ListenAddr, "listen", c.ListenAddr, "gRPC listen address (host:port)")
	fs.StringVar(&c.MetricsAddr, "metrics-listen", c.MetricsAddr, "HTTP listen address for /healthz, /readyz and /metrics")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory of the durable operation record")
	fs.StringVar(&c.Backend, "backend", c.Backend, "overlay backend: ovs | kernel-vxlan")
	fs.StringVar(&c.Profile, "profile", c.Profile, "CNI profile: '' (none) | openshift-sdn (also moves the SDN's firewall rules and br0 drop flow; ovs backend)")
	fs.StringVar(&c.OVSDB, "ovsdb", c.OVSDB, "OVSDB server (unix:/path or tcp:host:port)")
	fs.StringVar(&c.Bridge, "bridge", c.Bridge, "OVS bridge")
	fs.StringVar(&c.Interface, "interface", c.Interface, "OVS VXLAN interface")
	fs.BoolVar(&c.StandingRedirects, "ovs-standing-redirects", c.StandingRedirects, "keep the staged strategy's two redirect flows on the bridge between operations (installed at start, dormant between operations), so a staged operation changes no flow table; off: the listen adds them and the retirement removes them (ovs backend, not with --profile openshift-sdn)")
	fs.StringVar(&c.KernelDevice, "kernel-device", c.KernelDevice, "kernel VXLAN device (kernel-vxlan backend)")
	fs.StringVar(&c.FirewallChain, "firewall-chain", c.FirewallChain, "iptables chain where the new port is opened")
	fs.StringVar(&c.FirewallTable, "firewall-table", c.FirewallTable, "iptables table of --firewall-chain")
	fs.BoolVar(&c.ConntrackCleanup, "conntrack-cleanup", c.ConntrackCleanup, "kernel-vxlan: delete conntrack entries of the old port after the flip")
	fs.BoolVar(&c.CreateChain, "create-chain", c.CreateChain, "create --firewall-chain when it does not exist, with a jump to it at the top of INPUT (filter table)")
	fs.BoolVar(&c.StateNewMatch, "state-new-match", c.StateNewMatch, "match only NEW connections (-m state --state NEW) in the opening")
	fs.StringVar(&c.IptablesBackend, "iptables-backend", c.IptablesBackend, "iptables flavour: auto | nft | legacy")
	fs.StringVar(&c.NFTables, "nftables", c.NFTables, "native nftables input chains (not iptables') that would drop the new port: open (insert an accept at their top) | refuse (fail preflight, naming them) | ignore (do not look); firewalld's table is always refused")
	c.TLS.AddFlags(fs, "the coordinator's certificate", "this agent (role agent)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "serve gRPC without TLS and accept any caller: LOCAL LABS ONLY")
	fs.StringToStringVar(&c.Labels, "labels", c.Labels, "node labels reported to the coordinator (k=v,k2=v2)")
	fs.DurationVar(&c.Deadman, "deadman", c.Deadman, "dead-man duration when a commit does not give one")
	fs.DurationVar(&c.MaxDeadman, "max-deadman", c.MaxDeadman, "longest dead-man duration a commit may ask for")
	fs.DurationVar(&c.PrepareTimeout, "prepare-timeout", c.PrepareTimeout, "abort a prepared operation not committed or rolled back within this")
	fs.DurationVar(&c.MaxCommitDelay, "max-commit-delay", c.MaxCommitDelay, "how far in the future a commit instant may lie")
	fs.DurationVar(&c.CallTimeout, "call-timeout", c.CallTimeout, "timeout of each dataplane call the agent makes on its own (apply, revert, abort)")
	fs.DurationVar(&c.BackendRetry, "backend-retry", c.BackendRetry, "interval between attempts to set up the backend while it fails")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug | info | warn | error")
	fs.DurationVar(&c.PortRefresh, "port-refresh", c.PortRefresh, "how often the VXLAN port is read back from the dataplane for cutover_agent_current_port (0: only on RPCs)")
	fs.BoolVar(&c.Probe, "probe", c.Probe, "run the overlay probe mesh (verify proves the overlay carries traffic with it)")
	fs.StringVar(&c.ProbeListen, "probe-listen", c.ProbeListen, "overlay ip:port the probe mesh sends from and answers on (overrides --probe-address, --probe-interface and --probe-port)")
	fs.StringVar(&c.ProbeAddress, "probe-address", c.ProbeAddress, "overlay IP the probe mesh uses (default: found on --probe-interface)")
	fs.StringVar(&c.ProbeInterface, "probe-interface", c.ProbeInterface, "interface whose IPv4 is the node's overlay address (default: "+DefaultOVSProbeInterface+" for --backend ovs, --kernel-device for kernel-vxlan)")
	fs.IntVar(&c.ProbePort, "probe-port", c.ProbePort, "UDP port of the probe mesh on the overlay address")
	fs.StringVar(&c.ProbePeers, "probe-peers", c.ProbePeers, "static probe targets over the overlay, name=ip:port,...; the peers a coordinator sends with Prepare replace them")
	fs.DurationVar(&c.ProbeInterval, "probe-interval", c.ProbeInterval, "interval between two probes to the same peer (1ms to 1m)")
	fs.DurationVar(&c.ProbeTimeout, "probe-timeout", c.ProbeTimeout, "an unanswered probe counts as lost after this")
	fs.DurationVar(&c.ProbeLinger, "probe-linger", c.ProbeLinger, "keep probing the peers a Prepare gave this long after the operation ended, then go back to --probe-peers (0: keep them until the next Prepare)")
	fs.StringVar(&c.UnderlayAddress, "underlay-address", c.UnderlayAddress, "node IP the overlay tunnel sends from, where the path check binds the target port (default: the --listen host)")
	fs.UintSliceVar(&c.OverlayVNIs, "overlay-vnis", c.OverlayVNIs, "ovs backend: VNIs the overlay uses (openshift-sdn multitenant netids); default 0")
	fs.IntVar(&c.OverlayMTU, "overlay-mtu", c.OverlayMTU, "MTU of the overlay's inner packets for the path check (default: read from the dataplane)")
}

// FlagError is a bad flag value: which flag, which value, why.
type FlagError struct {
	Flag   string
	Value  string
	Reason string
}

func (e *FlagError) Error() string {
	return fmt.Sprintf("--%s %q: %s", e.Flag, e.Value, e.Reason)
}

var (
	dns1123     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelKey    = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValue  = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	chainName   = regexp.MustCompile(`^[A-Za-z0-9_][-A-Za-z0-9_.]*$`)
	tables      = []string{"filter", "raw", "mangle", "nat", "security"}
	iptBackends = []string{"auto", "nft", "legacy"}
	logLevels   = []string{"debug", "info", "warn", "error"}
)

// Validate checks every field and returns all problems at once, each
// naming the flag, the value and the reason.
func (c Config) Validate() error {
	var errs []error
	bad := func(flag, value, format string, args ...any) {
		errs = append(errs, &FlagError{Flag: flag, Value: value, Reason: fmt.Sprintf(format, args...)})
	}
	switch {
	case c.NodeName == "":
		bad("node-name", c.NodeName, "empty (and the hostname could not be read): give the node's name")
	case len(c.NodeName) > 253 || !dns1123.MatchString(c.NodeName):
		bad("node-name", c.NodeName, "not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)")
	}
	if err := checkAddr(c.ListenAddr); err != nil {
		bad("listen", c.ListenAddr, "%v", err)
	}
	if err := checkAddr(c.MetricsAddr); err != nil {
		bad("metrics-listen", c.MetricsAddr, "%v", err)
	} else if c.MetricsAddr == c.ListenAddr && !strings.HasSuffix(c.ListenAddr, ":0") {
		bad("metrics-listen", c.MetricsAddr, "same address as --listen; give each its own port")
	}
	if c.StateDir == "" || !strings.HasPrefix(c.StateDir, "/") {
		bad("state-dir", c.StateDir, "must be an absolute path")
	}
	switch c.Backend {
	case BackendOVS:
		if err := checkOVSDB(c.OVSDB); err != nil {
			bad("ovsdb", c.OVSDB, "%v", err)
		}
		if err := checkIfName(c.Bridge); err != nil {
			bad("bridge", c.Bridge, "%v", err)
		}
		if err := checkIfName(c.Interface); err != nil {
			bad("interface", c.Interface, "%v", err)
		}
	case BackendKernelVXLAN:
		if err := checkIfName(c.KernelDevice); err != nil {
			bad("kernel-device", c.KernelDevice, "%v", err)
		}
	default:
		bad("backend", c.Backend, "unknown backend: want %s or %s", BackendOVS, BackendKernelVXLAN)
	}
	switch c.Profile {
	case ProfileNone:
	case ProfileOpenShiftSDN:
		if c.Backend != BackendOVS {
			bad("profile", c.Profile, "needs --backend %s (openshift-sdn runs OVS), not %s", BackendOVS, c.Backend)
		}
	default:
		bad("profile", c.Profile, "unknown profile: want '' (none) or %s", ProfileOpenShiftSDN)
	}
	if c.StandingRedirects {
		switch {
		case c.Backend != BackendOVS:
			bad("ovs-standing-redirects", "true", "needs --backend %s: the flows are OpenFlow flows on the bridge, not %s", BackendOVS, c.Backend)
		case c.Profile == ProfileOpenShiftSDN:
			bad("ovs-standing-redirects", "true", "not with --profile %s: the SDN owns br0's flows and the profile refuses the staged strategy the flows serve", ProfileOpenShiftSDN)
		}
	}
	switch {
	case c.FirewallChain == "":
		bad("firewall-chain", c.FirewallChain, "empty")
	case len(c.FirewallChain) > 28:
		bad("firewall-chain", c.FirewallChain, "longer than iptables' 28-character limit (%d)", len(c.FirewallChain))
	case !chainName.MatchString(c.FirewallChain):
		bad("firewall-chain", c.FirewallChain, "only letters, digits, '_', '-' and '.' are allowed")
	}
	if !slices.Contains(tables, c.FirewallTable) {
		bad("firewall-table", c.FirewallTable, "unknown iptables table: want one of %s", strings.Join(tables, ", "))
	}
	if !slices.Contains(iptBackends, c.IptablesBackend) {
		bad("iptables-backend", c.IptablesBackend, "want one of %s", strings.Join(iptBackends, ", "))
	}
	if !slices.Contains(dataplane.NFTModes, c.NFTables) {
		bad("nftables", c.NFTables, "want one of %s", strings.Join(dataplane.NFTModes, ", "))
	}
	if c.PortRefresh < 0 || (c.PortRefresh > 0 && c.PortRefresh < 100*time.Millisecond) {
		bad("port-refresh", c.PortRefresh.String(), "must be 0 (off) or at least 100ms")
	}
	if c.ProbeLinger < 0 {
		bad("probe-linger", c.ProbeLinger.String(), "must be 0 (keep the peers) or positive")
	}
	if c.UnderlayAddress != "" {
		if a, err := netip.ParseAddr(c.UnderlayAddress); err != nil || !a.Is4() || a.IsUnspecified() || a.IsMulticast() {
			bad("underlay-address", c.UnderlayAddress, "not a unicast IPv4 address (want the node IP the tunnel sends from, e.g. 198.18.0.11)")
		}
	}
	for _, v := range c.OverlayVNIs {
		if v >= 1<<24 {
			bad("overlay-vnis", strconv.FormatUint(uint64(v), 10), "not a VNI (0-16777215)")
		}
	}
	if c.OverlayMTU != 0 && (c.OverlayMTU < 576 || c.OverlayMTU > 65535-pathprobe.Overhead) {
		bad("overlay-mtu", strconv.Itoa(c.OverlayMTU), "want 0 (read from the dataplane) or 576-%d", 65535-pathprobe.Overhead)
	}
	if c.Probe {
		if _, err := c.probeConfig(); err != nil {
			var fe *FlagError
			if errors.As(err, &fe) {
				errs = append(errs, fe)
			} else {
				bad("probe-peers", c.ProbePeers, "%v", err)
			}
		}
		if c.ProbeListen != "" && c.ProbeAddress != "" {
			bad("probe-address", c.ProbeAddress, "given together with --probe-listen %s: give one", c.ProbeListen)
		}
		if a, err := netip.ParseAddr(c.ProbeAddress); c.ProbeAddress != "" && (err != nil || a.IsUnspecified() || a.IsMulticast()) {
			bad("probe-address", c.ProbeAddress, "not a unicast IP address (want the node's overlay IP, e.g. 198.19.1.1)")
		}
		if c.ProbeInterface != "" {
			if err := checkIfName(c.ProbeInterface); err != nil {
				bad("probe-interface", c.ProbeInterface, "%v", err)
			}
		}
		if c.ProbePort < 1 || c.ProbePort > 65535 {
			bad("probe-port", strconv.Itoa(c.ProbePort), "not a UDP port (1-65535)")
		}
	} else if c.ProbeListen != "" || c.ProbePeers != "" {
		flag, v := "probe-listen", c.ProbeListen
		if v == "" {
			flag, v = "probe-peers", c.ProbePeers
		}
		bad(flag, v, "given together with --probe=false: drop one")
	}
	tlsFlags := []struct{ flag, value string }{{"tls-ca", c.TLS.CA}, {"tls-cert", c.TLS.Cert}, {"tls-key", c.TLS.Key}}
	for _, f := range tlsFlags {
		switch {
		case c.Insecure && f.value != "":
			bad(f.flag, f.value, "given together with --insecure: drop --insecure to use TLS, or drop the TLS flags")
		case !c.Insecure && f.value == "":
			bad(f.flag, f.value, "required: the agent serves mutual TLS only (--insecure is for local labs)")
		case f.value != "":
			if _, err := os.Stat(f.value); err != nil {
				bad(f.flag, f.value, "cannot read the file: %v", unwrapPath(err))
			}
		}
	}
	keys := make([]string, 0, len(c.Labels))
	for k := range c.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := c.Labels[k]
		if len(k) > 317 || !labelKey.MatchString(k) {
			bad("labels", k+"="+v, "key %q is not a valid label key ([prefix/]name of letters, digits, '-', '_', '.')", k)
		}
		if len(v) > 63 || !labelValue.MatchString(v) {
			bad("labels", k+"="+v, "value %q is not a valid label value (at most 63 letters, digits, '-', '_', '.')", v)
		}
	}
	positive := func(flag string, d time.Duration) {
		if d <= 0 {
			bad(flag, d.String(), "must be positive")
		}
	}
	positive("deadman", c.Deadman)
	positive("max-deadman", c.MaxDeadman)
	positive("prepare-timeout", c.PrepareTimeout)
	positive("max-commit-delay", c.MaxCommitDelay)
	positive("call-timeout", c.CallTimeout)
	positive("backend-retry", c.BackendRetry)
	if c.Deadman > c.MaxDeadman && c.MaxDeadman > 0 {
		bad("deadman", c.Deadman.String(), "longer than --max-deadman %s", c.MaxDeadman)
	}
	if !slices.Contains(logLevels, c.LogLevel) {
		bad("log-level", c.LogLevel, "want one of %s", strings.Join(logLevels, ", "))
	}
	return errors.Join(errs...)
}

func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("not host:port: %w", unwrapAddr(err))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number in 0-65535", port)
	}
	if host != "" && net.ParseIP(host) == nil && !dns1123.MatchString(host) {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	return nil
}

func checkOVSDB(s string) error {
	switch {
	case strings.HasPrefix(s, "unix:"):
		if !strings.HasPrefix(strings.TrimPrefix(s, "unix:"), "/") {
			return errors.New("unix socket path must be absolute (unix:/var/run/openvswitch/db.sock)")
		}
		return nil
	case strings.HasPrefix(s, "tcp:"):
		if err := checkAddr(strings.TrimPrefix(s, "tcp:")); err != nil {
			return err
		}
		return nil
	}
	return errors.New("want unix:/path or tcp:host:port")
}

// checkIfName applies the kernel's rules for interface names (also used by
// OVS for bridges and ports).
func checkIfName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 15:
		return fmt.Errorf("longer than the kernel's 15-character interface name limit (%d)", len(s))
	case s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n"):
		return errors.New("not a valid interface name (no '/', ':' or whitespace)")
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func unwrapAddr(err error) error {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return errors.New(ae.Err)
	}
	return err
}

// probeConfig builds the probe mesh's config from the flags. Listen is
// zero unless --probe-listen gives it: the address is then found at run
// time (overlayAddress).
func (c Config) probeConfig() (probe.Config, error) {
	var pc probe.Config
	var ap netip.AddrPort
	if c.ProbeListen != "" {
		var err error
		if ap, err = netip.ParseAddrPort(c.ProbeListen); err != nil {
			return pc, &FlagError{Flag: "probe-listen", Value: c.ProbeListen, Reason: "want the node's overlay ip:port, e.g. 198.19.1.1:9445"}
		}
	}
	peers, err := probe.ParsePeers(c.ProbePeers)
	if err != nil {
		return pc, &FlagError{Flag: "probe-peers", Value: c.ProbePeers, Reason: err.Error()}
	}
	pc = probe.Config{Listen: ap, Peers: peers, Interval: c.ProbeInterval, Timeout: c.ProbeTimeout}
	if err := probe.CheckPeers(peers); err != nil {
		return pc, &FlagError{Flag: "probe-peers", Value: c.ProbePeers, Reason: err.Error()}
	}
	if err := pc.Validate(); err != nil {
		flag := "probe-interval"
		if c.ProbeTimeout < c.ProbeInterval {
			flag = "probe-timeout"
		}
		return pc, &FlagError{Flag: flag, Value: fmt.Sprint(map[string]time.Duration{"probe-interval": c.ProbeInterval, "probe-timeout": c.ProbeTimeout}[flag]), Reason: err.Error()}
	}
	return pc, nil
}
