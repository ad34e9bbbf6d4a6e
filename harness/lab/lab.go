package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/pkg/execseam"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// StopGrace is how long Down waits after SIGTERM before SIGKILL.
var StopGrace = 3 * time.Second

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	mu  sync.Mutex
	st  state
	ovs map[string]*ovsproc.Instance // by node name
}

// Up creates the lab described by cfg (defaults applied) and returns once
// every node is configured (and, with StartProcesses, every process runs).
// On failure it tears down whatever it made. A lab already present in the
// dir, or leftover namespaces of the same name, is an error wrapping
// ErrExists: run Down (or Teardown) first.
func Up(ctx context.Context, cfg Config) (*Lab, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkNeighbours(cfg.Nodes, readNeighThresh3); err != nil {
		return nil, err
	}
	var err error
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, &ConfigError{"Dir", cfg.Dir, err.Error()}
	}
	if _, err := readState(cfg.Dir); err == nil {
		return nil, fmt.Errorf("lab %q: a lab is already recorded in %s: %w; tear it down first (cutover-lab down --name %s)", cfg.Name, cfg.Dir, ErrExists, cfg.Name)
	}
	if left, err := labNamespaces(cfg.Name, nil); err != nil {
		return nil, err
	} else if len(left) > 0 {
		return nil, fmt.Errorf("lab %q: namespaces %s: %w (a previous run's leftovers?); tear down first (cutover-lab down --name %s)", cfg.Name, strings.Join(left, ", "), ErrExists, cfg.Name)
	}
	if cfg.StartProcesses {
		for _, b := range []*string{&cfg.AgentBin, &cfg.CoordinatorBin} {
			if *b, err = filepath.Abs(*b); err != nil {
				return nil, err
			}
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	l := &Lab{ovs: map[string]*ovsproc.Instance{}}
	l.st = state{Config: cfg, Phase: "creating", Created: time.Now().UTC()}
	l.st.Namespaces = []string{HubNetns(cfg.Name)}
	for i := 1; i <= cfg.Nodes; i++ {
		n := newNode(cfg.Name, cfg.Dir, i, cfg.Backend)
		l.st.Nodes = append(l.st.Nodes, n)
		l.st.Namespaces = append(l.st.Namespaces, n.Netns)
	}
	// Recorded before anything exists: from here on, Down can clean up.
	if err := l.record(func(*state) {}); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := l.build(ctx); err != nil {
		_ = l.record(func(s *state) { s.Phase = "failed" })
		// Tear down with a fresh context: ctx may be what failed.
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("lab %q up: %w", cfg.Name, err), l.Down(dctx))
	}
	if err := l.record(func(s *state) { s.Phase = "up" }); err != nil {
		return l, err
	}
	cfg.Logger.Info("lab up", "name", cfg.Name, "nodes", cfg.Nodes, "backend", cfg.Backend, "took", time.Since(start).Round(time.Millisecond))
	return l, nil
}

func (l *Lab) cfg() Config { return l.st.Config } // immutable after Up/Load

func (l *Lab) build(ctx context.Context) error {
	cfg := l.cfg()
	log := cfg.Logger
	hub := HubNetns(cfg.Name)
	if err := netns.Create(hub); err != nil {
		return err
	}
	if err := ipBatch(ctx, hub, hubLines()); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	nodes := l.st.Nodes
	if err := forEach(ctx, len(nodes), cfg.Parallel, func(k int) error {
		if err := netns.Create(nodes[k].Netns); err != nil {
			return err
		}
		return quietIPv6(nodes[k].Netns)
	}); err != nil {
		return err
	}
	var veths []string
	for _, n := range nodes {
		veths = append(veths, hubVethLines(n)...)
	}
	if err := ipBatch(ctx, hub, veths); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	log.Debug("lab: namespaces and links made", "nodes", len(nodes))
	err := forEach(ctx, len(nodes), cfg.Parallel, func(k int) error {
		n := nodes[k]
		if err := os.MkdirAll(n.StateDir, 0o755); err != nil {
			return err
		}
		if err := ipBatch(ctx, n.Netns, nodeBaseLines(n)); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := setupFirewall(ctx, n, cfg.Port); err != nil {
			return err
		}
		if cfg.Backend == BackendKernelVXLAN {
			return setupKernelNode(ctx, n, nodes, cfg.Port, true)
		}
		inst, err := setupOVSNode(ctx, n, nodes, cfg.Port, l.addProc)
		if inst != nil {
			l.mu.Lock()
			l.ovs[n.Name] = inst
			l.mu.Unlock()
		}
		return err
	})
	if err != nil {
		return err
	}
	if cfg.Backend == BackendOVS {
		if err := l.announce(ctx); err != nil {
			return err
		}
	}
	if cfg.StartProcesses {
		return l.startProcesses(ctx)
	}
	return nil
}

// forEach runs fn(0..n-1) with at most par at once; after the first error
// it starts no more and returns all errors seen.
func forEach(ctx context.Context, n, par int, fn func(int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	sem := make(chan struct{}, par)
	for k := 0; k < n; k++ {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(k); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) == 0 && ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// Load returns the lab recorded in dir (by a previous Up, possibly of a
// process that has since died). Its OVS handles talk to the running
// daemons but do not own them; Down stops them by recorded PID.
func Load(dir string) (*Lab, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	st.Config = st.Config.Default() // Logger and anything a newer version added
	l := &Lab{st: st, ovs: map[string]*ovsproc.Instance{}}
	for _, n := range st.Nodes {
		if n.OVSDir != "" {
			l.ovs[n.Name] = &ovsproc.Instance{Dir: n.OVSDir, Netns: n.Netns, DBSock: n.OVSDBSock}
		}
	}
	return l, nil
}

// Teardown removes lab cfg.Name: with its record (cfg.Dir, default
// /run/cutover-lab/<name>) as Down does, and without one by sweeping the
// lab's namespaces and what runs in them. Nothing there is not an error.
func Teardown(ctx context.Context, cfg Config) error {
	cfg = cfg.Default()
	if !nameRE.MatchString(cfg.Name) {
		return cfg.Validate()
	}
	l, err := Load(cfg.Dir)
	if err == nil {
		return l.Down(ctx)
	}
	if !IsNotFound(err) {
		return err
	}
	l = &Lab{st: state{Config: cfg}}
	return l.Down(ctx)
}

// Down stops every process, deletes every namespace and removes the lab
// dir. It is idempotent and works on a half-built or crashed lab.
func (l *Lab) Down(ctx context.Context) error {
	l.mu.Lock()
	cfg := l.st.Config
	procs := append([]Proc(nil), l.st.Procs...)
	recorded := append([]string(nil), l.st.Namespaces...)
	insts := make([]*ovsproc.Instance, 0, len(l.ovs))
	for _, i := range l.ovs {
		insts = append(insts, i)
	}
	l.mu.Unlock()

	var errs []error
	// Agents and coordinator first (they hold OVS connections), then OVS.
	var first, second []Proc
	for _, p := range procs {
		if p.Role == "agent" || p.Role == "coordinator" {
			first = append(first, p)
		} else {
			second = append(second, p)
		}
	}
	errs = append(errs, stopProcs(first, StopGrace), stopProcs(second, StopGrace))
	// Instances started by this process: reap them (a no-op once dead).
	for _, i := range insts {
		errs = append(errs, i.Stop())
	}
	nss, err := labNamespaces(cfg.Name, recorded)
	errs = append(errs, err)
	// Anything still running in our namespaces is ours (PIDs not recorded
	// because the recorder died between spawn and record): stop it by PID.
	var strays []Proc
	for _, ns := range nss {
		ps, err := procsInNetns(ns)
		errs = append(errs, err)
		strays = append(strays, ps...)
	}
	if len(strays) > 0 {
		cfg.Logger.Warn("lab: stopping unrecorded processes in lab namespaces", "procs", fmt.Sprint(strays))
		errs = append(errs, stopProcs(strays, StopGrace))
	}
	for _, ns := range nss {
		errs = append(errs, netns.Delete(ns))
	}
	errs = append(errs, removeLabDir(cfg.Dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab %q down: %w", cfg.Name, err)
	}
	return nil
}

// labNamespaces is the union of recorded and existing namespaces of lab
// name, existing ones matched exactly (never another lab's).
func labNamespaces(name string, recorded []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, ns := range recorded {
		if !seen[ns] && netns.Exists(ns) {
			seen[ns] = true
			out = append(out, ns)
		}
	}
	all, err := netns.List(nsPrefix(name))
	if err != nil {
		return out, fmt.Errorf("lab: list namespaces: %w", err)
	}
	for _, ns := range all {
		if !seen[ns] && isLabNetns(name, ns) {
			seen[ns] = true
			out = append(out, ns)
		}
	}
	return out, nil
}

// removeLabDir removes dir only if it is a lab dir (holds lab.json) or
// empty: a mistyped Dir must never cost anyone their files.
func removeLabDir(dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		return os.RemoveAll(dir)
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("lab: %s holds no %s and is not empty; left in place: %w", dir, StateFile, err)
	}
	return nil
}

// Name is the lab's name.
func (l *Lab) Name() string { return l.cfg().Name }

// Dir is the lab's directory.
func (l *Lab) Dir() string { return l.cfg().Dir }

// Config is the lab's configuration, defaults applied.
func (l *Lab) Config() Config { return l.cfg() }

// Nodes lists the nodes in index order.
func (l *Lab) Nodes() []Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Node(nil), l.st.Nodes...)
}

// Node returns the node called name (n<i>).
func (l *Lab) Node(name string) (Node, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.st.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("lab %q: node %q: %w (nodes are n1..n%d)", l.st.Config.Name, name, ErrNotFound, len(l.st.Nodes))
}

// OVS returns node name's Open vSwitch, nil on the kernel-vxlan backend.
func (l *Lab) OVS(name string) *ovsproc.Instance {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ovs[name]
}

// Procs lists the processes the lab recorded.
func (l *Lab) Procs() []Proc {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Proc(nil), l.st.Procs...)
}

// CoordinatorAddr is the coordinator's gRPC address (host:port on the
// management network, reachable from the hub and every node namespace; see
// CoordctlCommand), or "" when the lab runs no coordinator.
func (l *Lab) CoordinatorAddr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.CoordinatorTCP
}

// PKIDir is where the lab's certificates are ("" without processes or with
// Insecure).
func (l *Lab) PKIDir() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.PKIDir
}

func (l *Lab) netnsOf(node string) (string, error) {
	if node == "hub" {
		return HubNetns(l.cfg().Name), nil
	}
	n, err := l.Node(node)
	return n.Netns, err
}

// Command returns a command running argv inside node's namespace ("hub"
// for the hub). On OVS nodes the OVS_* environment points ovs-vsctl,
// ovs-ofctl and ovs-appctl at that node's own Open vSwitch.
func (l *Lab) Command(ctx context.Context, node string, argv ...string) (*exec.Cmd, error) {
	ns, err := l.netnsOf(node)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("lab: Command: empty argv")
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = os.Environ()
	if i := l.OVS(node); i != nil {
		cmd.Env = append(cmd.Env, i.Env()...)
	}
	return cmd, nil
}

// Exec runs argv inside node's namespace and returns its combined output.
func (l *Lab) Exec(ctx context.Context, node string, argv ...string) (string, error) {
	cmd, err := l.Command(ctx, node, argv...)
	if err != nil {
		return "", err
	}
	out, err := execseam.Run(cmd, "")
	return string(out), err
}

// Port reads node's VXLAN port back from the dataplane itself: OVS vxlan0
// options:dst_port (absent means OVS's default 4789), or flannel.1's
// dstport from the kernel.
func (l *Lab) Port(ctx context.Context, node string) (int, error) {
	n, err := l.Node(node)
	if err != nil {
		return 0, err
	}
	if i := l.OVS(node); i != nil {
		out, err := i.Vsctl(ctx, "get", "interface", "vxlan0", "options")
		if err != nil {
			return 0, err
		}
		return parseOVSPort(out)
	}
	out, err := run(ctx, "", "ip", "-n", n.Netns, "-d", "-j", "link", "show", "flannel.1")
	if err != nil {
		return 0, err
	}
	var links []struct {
		Linkinfo struct {
			InfoData struct {
				Port int `json:"port"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return 0, fmt.Errorf("lab: node %s: flannel.1: cannot read port from %q: %w", node, out, err)
	}
	if len(links) != 1 {
		return 0, fmt.Errorf("lab: node %s: flannel.1: want one link in %q", node, out)
	}
	return links[0].Linkinfo.InfoData.Port, nil
}

// parseOVSPort reads dst_port from an ovs-vsctl options map such as
// {dst_port="4889", key=flow, remote_ip=flow}.
func parseOVSPort(opts string) (int, error) {
	s := strings.Trim(strings.TrimSpace(opts), "{}")
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && k == "dst_port" {
			return strconv.Atoi(strings.Trim(v, `"`))
		}
	}
	return 4789, nil // OVS's default for VXLAN when dst_port is unset
}

// SetPortDirect changes node's VXLAN port the way the field report does,
// behind every agent's back: `ovs-vsctl set interface vxlan0
// options:dst_port=N`, or on kernel-vxlan recreating flannel.1 with its
// FDB, neighbor and route entries (a kernel VXLAN port cannot be changed in
// place). Tests and the benchmark's baselines use it.
func (l *Lab) SetPortDirect(ctx context.Context, node string, port int) error {
	if port < 1 || port > 65535 {
		return &ConfigError{"port", strconv.Itoa(port), "must be 1..65535"}
	}
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	if i := l.OVS(node); i != nil {
		_, err := i.Vsctl(ctx, "set", "interface", "vxlan0", "options:dst_port="+strconv.Itoa(port))
		return err
	}
	return setupKernelNode(ctx, n, l.Nodes(), port, false)
}

// announce has every OVS node send one gratuitous ARP from br-ul. Each
// peer's userspace tunnel snoops it into its tunnel neighbor table, so no
// node has to resolve a peer's underlay MAC with its own broadcast. Without
// it, a 32-node lab's first overlay traffic sets off ~N² underlay ARP
// broadcasts that every node's ovs-vswitchd must read from eth0; on a small
// machine its AF_PACKET socket overflows, replies are lost and pairs take
// tens of seconds to come up.
func (l *Lab) announce(ctx context.Context) error {
	nodes := l.Nodes()
	return forEach(ctx, len(nodes), l.cfg().Parallel, func(k int) error {
		n := nodes[k]
		i := l.OVS(n.Name)
		if i == nil {
			return nil
		}
		if err := sendGARP(ctx, i, n); err != nil {
			return fmt.Errorf("node %s: gratuitous ARP: %w", n.Name, err)
		}
		return nil
	})
}
