package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/pki"
)

// The late-commit policies (Config.LatePolicy; docs/faults.md, "Late
// commits").
const (
	// LateRollback: a node that applied more than the budget after the
	// instant (by its own report), or has no commit answer by the answer
	// deadline, rolls everyone back, and the agent itself refuses to apply
	// past the budget. The split lasts about the answer deadline at most.
	LateRollback = "rollback"
	// LateWait: the others stay flipped until the late node applies (or
	// its Commit call times out); the result is flagged. The split lasts
	// as long as the node was away.
	LateWait = "wait"
)

// Config is the coordinator's configuration. Start from Default, override,
// then Validate; AddFlags binds every field to a flag of the same meaning.
type Config struct {
	Listen        string   // gRPC API for coordctl
	MetricsListen string   // /healthz /readyz /metrics; empty disables
	Agents        []string // node=host:port, from --agent
	InventoryFile string   // JSON inventory, from --inventory
	TLS           pki.Files
	Insecure      bool   // no TLS at all: local labs only
	StateDir      string // journal of operations
	JournalKeep   int    // finished operations kept (Prunable), in the journal and in memory; 0: DefaultJournalKeep
	// Cluster is --kube: the agents are discovered from the Kubernetes
	// API, the journal is kept in ConfigMaps and one replica leads
	// (coordinator/kube); --agent, --inventory and --state-dir are not used.
	Cluster bool

	StepTimeout time.Duration // per-step deadline; a request's timeout_millis overrides it
	// AgentIdleTimeout closes an agent's connection after this long
	// without calls (0: never). gRPC's own default is 30 minutes, after
	// which the next operation dials every agent, mTLS handshakes
	// included, inside its preflight: at 1,000 simulated agents that made
	// the four phases 4.1 s instead of 1.1 s (docs/benchmarks.md).
	AgentIdleTimeout time.Duration
	Deadman          time.Duration // agent's dead-man timer after commit
	CommitLeadMin    time.Duration // floor of the commit lead time
	CommitLeadRTTx   int           // lead covers this many times the worst agent RTT
	CommitLeadPerAgt time.Duration // plus this much per targeted agent (0: the prepare round already measures the fan-out)
	// LateBudget is how late after the commit instant an agent may still
	// apply, judged by the applied time it reports (clock-corrected, less
	// the offset's error bound), never by when its answer arrives.
	// AnswerDeadline is how long after the instant that answer may take to
	// arrive: a node with no answer by then is treated as late too. A late
	// node under LatePolicy "rollback" rolls everyone back (the agent
	// itself refuses to apply past the budget); "wait" leaves the others
	// flipped until it answers and flags the result (docs/faults.md, "Late
	// commits"). LateBudget 0: no lateness check at all.
	LateBudget     time.Duration
	AnswerDeadline time.Duration
	LatePolicy     string
	// SpreadTarget is the commit spread (the nodes' wake-ups) above which
	// a SUCCEEDED atomic operation carries a warning: the barrier did not
	// hold (docs/faults.md, "Commit spread"). 0: no warning.
	SpreadTarget time.Duration
	ClockSamples int // Clock calls per agent at most; the lowest-RTT one is kept
	// ClockGoodRTT ends an agent's sampling early: a round trip this short
	// bounds the offset's error to half of it (0: always ClockSamples).
	// ClockParallel is how many agents are sampled at once.
	ClockGoodRTT     time.Duration
	ClockParallel    int
	RollbackAttempts int // tries of an abort/rollback per agent before Failed, at least
	// RollbackBackoff is the pause before retrying an abort or rollback to
	// an agent that was not reached; it doubles at each retry up to 8
	// times itself. Retries go on for the operation's dead-man duration
	// (plus a second), not only RollbackAttempts times: an agent that is
	// restarting is reached when it is back, and one that stays
	// unreachable has reverted by itself by then.
	RollbackBackoff time.Duration
	// ProbeSettle is how long the final read of the probe counters waits
	// for probes still in flight to be answered or time out: at least the
	// agents' --probe-timeout.
	ProbeSettle time.Duration
	// ProbePeersK is how many peers each node probes in the mesh the
	// coordinator hands out with Prepare (0, or more than there are
	// others: every other node). NoProbeVerify turns the built-in mesh
	// verifier off (--probe-verify=false): every result is then flagged,
	// never a clean success (I7). VerifyBudget bounds how long verify
	// waits for every sampled pair to answer a probe sent after the flip
	// (within the step timeout, which the dead-man covers).
	ProbePeersK   int
	NoProbeVerify bool
	VerifyBudget  time.Duration
	// The underlay path check every preflight runs (internal/preflight/pathcheck.go): each
	// agent binds the target port for PathWindow and resends unanswered
	// frames every PathInterval. Above PathSampleAbove nodes the pairs
	// are sampled: every node exchanges frames with at least PathPeersK
	// others, both ways. NoPathCheck turns it off (--path-check=false):
	// every result is then flagged.
	NoPathCheck     bool
	PathWindow      time.Duration
	PathInterval    time.Duration
	PathSampleAbove int
	PathPeersK      int
	// DefaultStrategy is what a request that names no strategy runs over
	// the whole overlay: "auto" (staged where it loses less by
	// the lab's figures at N = 32) or "atomic" (one instant, always). A
	// request that names nodes or a selector and no strategy runs atomic
	// either way: auto covers every node (docs/staged.md).
	DefaultStrategy string
}

// Default returns the defaults.
func Default() Config {
	return Config{
		// Not the agent's 9443/9444: a coordinator on a node shares the
		// host network with that node's agent.
		Listen:           ":9446",
		MetricsListen:    ":9447",
		StateDir:         "/var/lib/cutover/coordinator",
		JournalKeep:      model.DefaultJournalKeep,
		StepTimeout:      10 * time.Second,
		Deadman:          30 * time.Second,
		CommitLeadMin:    30 * time.Millisecond,
		CommitLeadRTTx:   4,
		CommitLeadPerAgt: 0,
		LateBudget:       200 * time.Millisecond,
		AnswerDeadline:   time.Second,
		SpreadTarget:     50 * time.Millisecond,
		LatePolicy:       LateRollback,
		ClockSamples:     8,
		ClockGoodRTT:     time.Millisecond,
		ClockParallel:    8,
		RollbackAttempts: 3,
		RollbackBackoff:  250 * time.Millisecond,
		ProbeSettle:      300 * time.Millisecond,
		ProbePeersK:      3,
		VerifyBudget:     2 * time.Second,
		PathWindow:       400 * time.Millisecond,
		PathInterval:     50 * time.Millisecond,
		PathSampleAbove:  16,
		PathPeersK:       4,
		DefaultStrategy:  model.StrategyAuto,
	}
}

// agentFlag collects repeatable --agent values.
type agentFlag struct{ v *[]string }

func (f agentFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f agentFlag) Set(s string) error { *f.v = append(*f.v, s); return nil }

func (agentFlag) Type() string { return "spec" }

// AddFlags binds c to fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC listen addresses of the coordinator API (coordctl), comma-separated: host:port or unix:/path")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "listen address of /healthz /readyz /metrics; empty disables")
	fs.Var(agentFlag{&c.Agents}, "agent", "an agent as node=host:port[@overlay] (repeatable); @overlay names a separate overlay the node belongs to (default: the default overlay)")
	fs.StringVar(&c.InventoryFile, "inventory", c.InventoryFile, `JSON inventory file: {"agents":[{"node":"n1","address":"host:port","labels":{},"overlay":"name"}]}; "overlay" (optional) names a separate overlay`)
	c.TLS.AddFlags(fs, "agents' and coordctl's certificates", "the coordinator (role coordinator)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "no TLS on either side: LOCAL LABS ONLY, anyone who can reach the port can change the overlay")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory of the operation journal (not used with --kube)")
	fs.IntVar(&c.JournalKeep, "journal-keep", c.JournalKeep, "finished operations kept in the journal (files, or ConfigMaps with --kube) and in memory; older ones are pruned. Unfinished operations are always kept")
	fs.BoolVar(&c.Cluster, "kube", c.Cluster, "run in a Kubernetes cluster: discover agents from the API, journal in ConfigMaps, leader election on a Lease or, with --leader-lock=configmap, a ConfigMap (see the --lease-*, --leader-lock, --agent-* and --cni flags)")
	fs.DurationVar(&c.StepTimeout, "step-timeout", c.StepTimeout, "deadline of each step on each agent")
	fs.DurationVar(&c.AgentIdleTimeout, "agent-idle-timeout", c.AgentIdleTimeout, "close an agent's connection after this long without calls (0: keep it open, so that an operation finds every agent connected; gRPC's default was 30m, after which an operation dials and handshakes every agent inside its preflight)")
	fs.DurationVar(&c.Deadman, "deadman", c.Deadman, "how long a committed agent waits for confirm before reverting by itself")
	fs.DurationVar(&c.CommitLeadMin, "commit-lead-min", c.CommitLeadMin, "minimum time between sending Commit and the commit instant")
	fs.IntVar(&c.CommitLeadRTTx, "commit-lead-rtt-factor", c.CommitLeadRTTx, "the commit lead covers this many times the worst agent round trip")
	fs.DurationVar(&c.CommitLeadPerAgt, "commit-lead-per-agent", c.CommitLeadPerAgt, "commit lead added per targeted agent (fan-out cost)")
	fs.DurationVar(&c.LateBudget, "commit-late-budget", c.LateBudget, "how late after the commit instant an agent may still apply; a later one is late (see --commit-late-policy; 0: no lateness check)")
	fs.DurationVar(&c.AnswerDeadline, "commit-answer-deadline", c.AnswerDeadline, "how long after the commit instant an agent's commit answer may take to arrive; a node with none by then counts as late (lateness itself is judged by when the node applied)")
	fs.DurationVar(&c.SpreadTarget, "commit-spread-target", c.SpreadTarget, "a commit spread (the nodes' wake-ups) above this flags a successful atomic operation with a warning: the nodes did not flip together (0: no warning)")
	fs.StringVar(&c.LatePolicy, "commit-late-policy", c.LatePolicy, `what a late node does to the operation: "rollback" (everyone is rolled back; the late agent applies nothing) or "wait" (the others stay flipped until it applies; the result is flagged)`)
	fs.IntVar(&c.ClockSamples, "clock-samples", c.ClockSamples, "Clock samples per agent for the offset at most (lowest RTT wins)")
	fs.DurationVar(&c.ClockGoodRTT, "clock-good-rtt", c.ClockGoodRTT, "stop sampling an agent's clock at a round trip this short (the offset's error is at most half of it); 0: always take --clock-samples")
	fs.IntVar(&c.ClockParallel, "clock-parallel", c.ClockParallel, "agents whose clocks are sampled at once (a round trip queued behind the coordinator's own calls is not the network's)")
	fs.IntVar(&c.RollbackAttempts, "rollback-attempts", c.RollbackAttempts, "tries of an abort or rollback per agent, at least, before the operation is declared failed")
	fs.DurationVar(&c.ProbeSettle, "probe-settle", c.ProbeSettle, "before the report's final probe read, wait this long for probes in flight to settle (at least the agents' --probe-timeout; 0: read at once)")
	fs.IntVar(&c.ProbePeersK, "probe-peers-k", c.ProbePeersK, "peers each node probes in the mesh sent with Prepare and checked by verify: every node probes this many others, the same that probe it (an odd count over an odd number of nodes: one more; 0: all)")
	fs.VarPF(invertedBool{&c.NoProbeVerify}, "probe-verify", "", "verify after the change that every sampled pair answers probes over the overlay (false: results are flagged as unverified, never a clean success)").NoOptDefVal = "true"
	fs.DurationVar(&c.VerifyBudget, "verify-budget", c.VerifyBudget, "how long verify waits for every sampled probe pair to answer after the flip (capped by the step timeout)")
	fs.StringVar(&c.DefaultStrategy, "default-strategy", c.DefaultStrategy, "what a cutover that names no strategy runs over the whole overlay: auto (staged where every node accepts it and loses less with it, else atomic) or atomic (every node at one instant)")
	fs.VarPF(invertedBool{&c.NoPathCheck}, "path-check", "", "check in every preflight that the underlay passes real VXLAN frames on the target port between the nodes (false: results are flagged as unchecked)").NoOptDefVal = "true"
	fs.DurationVar(&c.PathWindow, "path-check-window", c.PathWindow, "how long each agent holds the target port and exchanges frames in the path check")
	fs.DurationVar(&c.PathInterval, "path-check-interval", c.PathInterval, "the path check resends unanswered frames this often")
	fs.IntVar(&c.PathSampleAbove, "path-check-sample-above", c.PathSampleAbove, "above this many nodes the path check samples pairs (every node still sends and receives) instead of checking every pair")
	fs.IntVar(&c.PathPeersK, "path-check-peers-k", c.PathPeersK, "peers each node exchanges frames with when the path check samples")
	fs.DurationVar(&c.RollbackBackoff, "rollback-backoff", c.RollbackBackoff, "pause before retrying an abort or rollback to an unreached agent, doubling up to 8x; retries span the dead-man duration (0: retry at once, only --rollback-attempts times)")
}

// Validate checks c; errors name the flag, the value and the reason.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.ListenAddrs(); err != nil {
		errs = append(errs, err)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: want host:port: %w", c.MetricsListen, err))
		}
	}
	switch {
	case c.Cluster && (len(c.Agents) > 0 || c.InventoryFile != ""):
		errs = append(errs, fmt.Errorf("--agent %q / --inventory %q: not used with --kube, where the agents are discovered from the cluster: drop them, or drop --kube", c.Agents, c.InventoryFile))
	case !c.Cluster && len(c.Agents) == 0 && c.InventoryFile == "":
		errs = append(errs, errors.New("--agent / --inventory: no agents given: name at least one agent (--agent node=host:port) or an inventory file, or run in a cluster with --kube"))
	}
	if !c.Insecure {
		if err := c.TLS.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w (or --insecure for a local lab)", err))
		}
	}
	if c.StateDir == "" && !c.Cluster {
		errs = append(errs, errors.New("--state-dir: empty: the journal needs a directory"))
	}
	if c.JournalKeep < 0 {
		errs = append(errs, fmt.Errorf("--journal-keep %d: want at least 1 (the last finished operation is what coordctl rollback undoes)", c.JournalKeep))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--step-timeout %s: must be positive", c.StepTimeout))
	}
	if c.AgentIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("--agent-idle-timeout %s: must not be negative (0 keeps connections open)", c.AgentIdleTimeout))
	}
	if c.Deadman <= 2*c.StepTimeout {
		errs = append(errs, fmt.Errorf("--deadman %s: must exceed twice --step-timeout (%s): verify and confirm must fit before agents revert by themselves", c.Deadman, c.StepTimeout))
	}
	if c.CommitLeadMin <= 0 {
		errs = append(errs, fmt.Errorf("--commit-lead-min %s: must be positive", c.CommitLeadMin))
	}
	if c.LateBudget < 0 || (c.LateBudget > 0 && (c.AnswerDeadline <= c.LateBudget || c.AnswerDeadline >= c.StepTimeout)) {
		errs = append(errs, fmt.Errorf("--commit-late-budget %s, --commit-answer-deadline %s: the budget must not be negative, and the answer deadline must be longer than the budget and shorter than --step-timeout %s", c.LateBudget, c.AnswerDeadline, c.StepTimeout))
	}
	if c.SpreadTarget < 0 {
		errs = append(errs, fmt.Errorf("--commit-spread-target %s: must not be negative (0: no warning)", c.SpreadTarget))
	}
	if c.LatePolicy != LateRollback && c.LatePolicy != LateWait {
		errs = append(errs, fmt.Errorf("--commit-late-policy %q: must be %q or %q", c.LatePolicy, LateRollback, LateWait))
	}
	if c.CommitLeadRTTx < 1 {
		errs = append(errs, fmt.Errorf("--commit-lead-rtt-factor %d: must be at least 1", c.CommitLeadRTTx))
	}
	if c.CommitLeadPerAgt < 0 {
		errs = append(errs, fmt.Errorf("--commit-lead-per-agent %s: must not be negative", c.CommitLeadPerAgt))
	}
	if c.ClockSamples < 1 || c.ClockSamples > 100 {
		errs = append(errs, fmt.Errorf("--clock-samples %d: want 1–100", c.ClockSamples))
	}
	if c.ClockGoodRTT < 0 || c.ClockGoodRTT > 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--clock-good-rtt %s: want 0 (always --clock-samples) to 100ms (an offset error of up to 50ms)", c.ClockGoodRTT))
	}
	if c.ClockParallel < 1 || c.ClockParallel > 4096 {
		errs = append(errs, fmt.Errorf("--clock-parallel %d: want 1–4096", c.ClockParallel))
	}
	if c.RollbackAttempts < 1 {
		errs = append(errs, fmt.Errorf("--rollback-attempts %d: must be at least 1", c.RollbackAttempts))
	}
	if c.ProbeSettle < 0 || c.ProbeSettle > time.Minute {
		errs = append(errs, fmt.Errorf("--probe-settle %v: must be between 0 and 1m", c.ProbeSettle))
	}
	if c.ProbePeersK < 0 || c.ProbePeersK > 64 {
		errs = append(errs, fmt.Errorf("--probe-peers-k %d: want 0 (every other node) to 64 (an agent's most peers)", c.ProbePeersK))
	}
	if c.VerifyBudget < 0 || c.VerifyBudget > time.Minute {
		errs = append(errs, fmt.Errorf("--verify-budget %s: want 0 (the default, 2s) to 1m", c.VerifyBudget))
	}
	if c.RollbackBackoff < 0 || c.RollbackBackoff > time.Minute {
		errs = append(errs, fmt.Errorf("--rollback-backoff %s: want 0 (retry at once) to 1m", c.RollbackBackoff))
	}
	if c.PathWindow < 50*time.Millisecond || c.PathWindow > 10*time.Second {
		errs = append(errs, fmt.Errorf("--path-check-window %s: want 50ms to 10s", c.PathWindow))
	}
	if c.PathInterval < time.Millisecond || c.PathInterval*2 > c.PathWindow {
		errs = append(errs, fmt.Errorf("--path-check-interval %s: want at least 1ms and at most half --path-check-window (%s)", c.PathInterval, c.PathWindow))
	}
	if c.DefaultStrategy != model.StrategyAuto && c.DefaultStrategy != model.StrategyAtomic {
		errs = append(errs, fmt.Errorf("--default-strategy %q: want auto or atomic (staged is asked for by name: it takes batches and subsets)", c.DefaultStrategy))
	}
	if c.PathSampleAbove < 2 {
		errs = append(errs, fmt.Errorf("--path-check-sample-above %d: want at least 2", c.PathSampleAbove))
	}
	if c.PathPeersK < 1 || c.PathPeersK > 64 {
		errs = append(errs, fmt.Errorf("--path-check-peers-k %d: want 1 to 64", c.PathPeersK))
	}
	return errors.Join(errs...)
}

// ListenAddr is one API listen address: network "tcp" or "unix".
type ListenAddr struct{ Network, Addr string }

// ListenAddrs parses --listen: comma-separated host:port or unix:/abs/path.
// A unix socket lets coordctl reach a coordinator in another network
// namespace (a lab's hub) through the filesystem.
func (c Config) ListenAddrs() ([]ListenAddr, error) {
	var out []ListenAddr
	for _, a := range strings.Split(c.Listen, ",") {
		a = strings.TrimSpace(a)
		if path, ok := strings.CutPrefix(a, "unix:"); ok {
			path = "/" + strings.TrimLeft(path, "/")
			if path == "/" {
				return nil, fmt.Errorf("--listen %q: unix: needs an absolute socket path, e.g. unix:/run/cutover/coordinator.sock", c.Listen)
			}
			out = append(out, ListenAddr{"unix", path})
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("--listen %q: %q: want host:port or unix:/path: %w", c.Listen, a, err)
		}
		out = append(out, ListenAddr{"tcp", a})
	}
	return out, nil
}

// invertedBool binds a "--x" flag (default true) to a NoX field, so that
// the zero Config keeps the safe behaviour.
type invertedBool struct{ no *bool }

func (b invertedBool) String() string {
	if b.no == nil {
		return "true"
	}
	return fmt.Sprint(!*b.no)
}

func (b invertedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.no = !v
	return nil
}

func (invertedBool) Type() string { return "bool" }

// KeptOperations is JournalKeep with 0 meaning the default.
func (c Config) KeptOperations() int {
	if c.JournalKeep <= 0 {
		return model.DefaultJournalKeep
	}
	return c.JournalKeep
}

// LoadInventory builds the inventory from the config's --agent flags and
// --inventory file together.
func (c Config) LoadInventory() (model.Inventory, error) {
	specs, err := model.ParseAgentFlags(c.Agents)
	if err != nil {
		return model.Inventory{}, err
	}
	source := "--agent"
	if c.InventoryFile != "" {
		fs, err := model.LoadInventoryFile(c.InventoryFile)
		if err != nil {
			return model.Inventory{}, err
		}
		specs = append(specs, fs...)
		source = c.InventoryFile
		if len(c.Agents) > 0 {
			source = "--agent + " + c.InventoryFile
		}
	}
	return model.NewInventory(source, specs)
}
