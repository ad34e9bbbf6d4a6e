package lab

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"runtime"
	"time"

	"github.com/spf13/pflag"
)

// Backends a lab can model.
const (
	BackendOVS         = "ovs"          // OpenShift SDN: OVS br0 with vxlan0
	BackendKernelVXLAN = "kernel-vxlan" // flannel: a kernel VXLAN device
)

// MaxNodes bounds a lab: node addresses are 198.18.0.(10+i) and MACs carry
// i in one byte.
const MaxNodes = 64

// DefaultPort is the VXLAN port a fresh lab starts on, per backend.
var DefaultPort = map[string]int{BackendOVS: 4789, BackendKernelVXLAN: 8472}

// Config describes a lab. The zero value plus Default gives an 8-node OVS lab
// named "lab" in /run/cutover-lab/lab without agents or coordinator.
type Config struct {
	Name    string `json:"name"`    // [a-z0-9]{1,12}; namespaces are cot-lab-<Name>-*
	Nodes   int    `json:"nodes"`   // 1..MaxNodes
	Backend string `json:"backend"` // BackendOVS or BackendKernelVXLAN
	Dir     string `json:"dir"`     // lab dir; default /run/cutover-lab/<Name>
	Port    int    `json:"port"`    // initial VXLAN port; default DefaultPort[Backend]

	// StartProcesses starts the real coordinator and one agent per node.
	StartProcesses bool   `json:"start_processes"`
	AgentBin       string `json:"agent_bin"`       // default bin/agent (relative to the current dir)
	CoordinatorBin string `json:"coordinator_bin"` // default bin/coordinator
	Insecure       bool   `json:"insecure"`        // no mTLS between the processes (debugging only)
	// ExtraAgentArgs and ExtraCoordinatorArgs are appended to the generated
	// command lines (e.g. probe settings).
	ExtraAgentArgs       []string `json:"extra_agent_args,omitempty"`
	ExtraCoordinatorArgs []string `json:"extra_coordinator_args,omitempty"`

	// Probe mesh (with StartProcesses): every agent sends UDP probes over
	// the overlay from <overlay ip>:ProbePort to ProbePeers peers every
	// ProbeInterval. NoProbes turns it off.
	NoProbes      bool          `json:"no_probes,omitempty"`
	ProbeInterval time.Duration `json:"probe_interval"` // default DefaultProbeInterval
	ProbeTimeout  time.Duration `json:"probe_timeout"`  // default max(200ms, 20×interval)
	// ProbePeers is how many peers each node probes; 0 means all. At 1 ms
	// on a small machine a full mesh of 32 nodes is more than a userspace
	// OVS can carry (docs/lab.md); probePeers spreads a sample evenly.
	ProbePeers int `json:"probe_peers"`

	// DefaultStrategy is the coordinator's --default-strategy: what a
	// cutover that names no strategy runs. Default "atomic", not the
	// product's "auto": the lab's tests of the atomic change (faults,
	// lateness, the benchmarks) send none, and auto would run staged on a
	// kernel VXLAN lab. "auto" runs the product's default (make demo, the
	// staged e2e tests).
	DefaultStrategy string `json:"default_strategy,omitempty"`

	// Parallel bounds how many nodes are set up at once; default
	// 2×CPUs, at least 4. Starting a userspace OVS is mostly waiting.
	Parallel int `json:"parallel"`

	Logger *slog.Logger `json:"-"` // default: discard
}

// DefaultProbeInterval is the lab's probe interval: 10 ms to all peers is
// what a 2-core machine carries at 32 OVS nodes without losing probes on
// its own (docs/lab.md has the measurements).
const DefaultProbeInterval = 10 * time.Millisecond

// ProbePort is the UDP port of the probe mesh on every node's overlay
// address.
const ProbePort = 9445

// DefaultDir is the lab dir of a lab called name when Config.Dir is empty.
func DefaultDir(name string) string { return filepath.Join("/run/cutover-lab", name) }

var nameRE = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// Default fills the empty fields of c with defaults and returns it.
func (c Config) Default() Config {
	if c.Name == "" {
		c.Name = "lab"
	}
	if c.Nodes == 0 {
		c.Nodes = 8
	}
	if c.Backend == "" {
		c.Backend = BackendOVS
	}
	if c.Dir == "" {
		c.Dir = DefaultDir(c.Name)
	}
	if c.Port == 0 {
		c.Port = DefaultPort[c.Backend]
	}
	if c.AgentBin == "" {
		c.AgentBin = "bin/agent"
	}
	if c.CoordinatorBin == "" {
		c.CoordinatorBin = "bin/coordinator"
	}
	if c.Parallel == 0 {
		c.Parallel = max(4, 2*runtime.NumCPU())
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	if c.DefaultStrategy == "" {
		c.DefaultStrategy = "atomic"
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = max(200*time.Millisecond, 20*c.ProbeInterval)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first bad field of a defaulted Config.
func (c Config) Validate() error {
	if !nameRE.MatchString(c.Name) {
		return &ConfigError{"Name", c.Name, "must be 1-12 characters of a-z and 0-9 (no '-': namespace names cot-lab-<name>-* must not overlap another lab's)"}
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		return &ConfigError{"Nodes", fmt.Sprint(c.Nodes), fmt.Sprintf("must be 1..%d", MaxNodes)}
	}
	if _, ok := DefaultPort[c.Backend]; !ok {
		return &ConfigError{"Backend", c.Backend, fmt.Sprintf("must be %q or %q", BackendOVS, BackendKernelVXLAN)}
	}
	if c.Port < 1 || c.Port > 65535 {
		return &ConfigError{"Port", fmt.Sprint(c.Port), "must be 1..65535"}
	}
	if c.Dir == "" || !filepath.IsAbs(c.Dir) && filepath.Clean(c.Dir) == "." {
		return &ConfigError{"Dir", c.Dir, "must name a directory"}
	}
	if d, err := filepath.Abs(c.Dir); err == nil && d == "/" {
		return &ConfigError{"Dir", c.Dir, "must not be / (Down removes the lab dir)"}
	}
	// ovsproc needs Dir/nNN/ovs/ovs-vswitchd.ctl under the 108-byte unix
	// socket limit; say so here rather than half way through Up.
	if d, err := filepath.Abs(c.Dir); err == nil && len(d)+len("/n64/ovs/ovs-vswitchd.ctl") >= 100 {
		return &ConfigError{"Dir", c.Dir, "too long: unix socket paths under it would exceed 108 bytes; use a shorter path"}
	}
	if c.DefaultStrategy != "atomic" && c.DefaultStrategy != "auto" {
		return &ConfigError{"DefaultStrategy", c.DefaultStrategy, `must be "atomic" or "auto" (the coordinator's --default-strategy)`}
	}
	if c.Parallel < 1 {
		return &ConfigError{"Parallel", fmt.Sprint(c.Parallel), "must be ≥ 1"}
	}
	if !c.NoProbes {
		if c.ProbeInterval < time.Millisecond || c.ProbeInterval > time.Minute {
			return &ConfigError{"ProbeInterval", c.ProbeInterval.String(), "must be 1ms..1m (the agent's --probe-interval range)"}
		}
		if c.ProbeTimeout < c.ProbeInterval {
			return &ConfigError{"ProbeTimeout", c.ProbeTimeout.String(), "must be at least ProbeInterval " + c.ProbeInterval.String()}
		}
		if c.ProbePeers < 0 || c.ProbePeers > c.Nodes-1 {
			return &ConfigError{"ProbePeers", fmt.Sprint(c.ProbePeers), fmt.Sprintf("must be 0 (all) .. %d (Nodes-1)", c.Nodes-1)}
		}
	}
	if c.StartProcesses {
		if c.AgentBin == "" {
			return &ConfigError{"AgentBin", c.AgentBin, "required with StartProcesses"}
		}
		if c.CoordinatorBin == "" {
			return &ConfigError{"CoordinatorBin", c.CoordinatorBin, "required with StartProcesses"}
		}
	}
	return nil
}

// ConfigError is a bad Config field.
type ConfigError struct {
	Field, Value, Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("lab config: %s %q: %s", e.Field, e.Value, e.Reason)
}

// AddFlags binds c's fields to flags (for `cutover-lab up`).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Name, "name", "lab", "lab name, [a-z0-9]{1,12}; namespaces are cot-lab-<name>-*")
	fs.IntVar(&c.Nodes, "nodes", 8, fmt.Sprintf("number of nodes (1..%d)", MaxNodes))
	fs.StringVar(&c.Backend, "backend", BackendOVS, "dataplane: ovs (OpenShift SDN shape) or kernel-vxlan (flannel shape)")
	fs.StringVar(&c.Dir, "dir", "", "lab dir (default /run/cutover-lab/<name>)")
	fs.IntVar(&c.Port, "port", 0, "initial VXLAN port (default 4789 for ovs, 8472 for kernel-vxlan)")
	fs.BoolVar(&c.StartProcesses, "processes", true, "start the coordinator and one agent per node")
	fs.StringVar(&c.AgentBin, "agent-bin", "bin/agent", "agent binary")
	fs.StringVar(&c.CoordinatorBin, "coordinator-bin", "bin/coordinator", "coordinator binary")
	fs.BoolVar(&c.Insecure, "insecure", false, "run the control path without mTLS (debugging only)")
	fs.BoolVar(&c.NoProbes, "no-probes", false, "start the agents without the overlay probe mesh")
	fs.DurationVar(&c.ProbeInterval, "probe-interval", DefaultProbeInterval, "interval between two probes to the same peer (1ms..1m)")
	fs.DurationVar(&c.ProbeTimeout, "probe-timeout", 0, "an unanswered probe counts as lost after this (default max(200ms, 20×interval))")
	fs.IntVar(&c.ProbePeers, "probe-peers", 0, "peers each node probes, spread evenly (0: all)")
	fs.StringVar(&c.DefaultStrategy, "default-strategy", "atomic", "the coordinator's --default-strategy: atomic (the lab's default) or auto (the product's)")
	fs.IntVar(&c.Parallel, "parallel", 0, "nodes set up at once (default 2×CPUs, at least 4)")
}
