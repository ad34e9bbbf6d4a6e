package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/pki"
	"github.com/cutover-dev/cutover/pkg/ringsample"
)

// Coordinator ports on the hub's management address.
const (
	CoordinatorPort        = 9444
	CoordinatorMetricsPort = 9445
)

// ReadyTimeout bounds how long Up waits for every process to be ready.
var ReadyTimeout = 30 * time.Second

func coordinatorAddr() string { return netip.AddrPortFrom(HubMgmt, CoordinatorPort).String() }

// agentArgs is node n's agent command line. Flag names follow
// `agent --help`; adjust here when they change.
func agentArgs(cfg Config, n Node, pkiDir string) []string {
	a := []string{
		"--node-name", n.Name,
		"--listen", n.AgentAddr,
		"--metrics-listen", n.Metrics,
		"--state-dir", n.StateDir,
		"--backend", cfg.Backend,
		// The agent listens on the management network; the path check
		// binds the target port on the underlay, where the tunnel runs.
		"--underlay-address", n.UnderlayIP.String(),
		// A fresh namespace has no OpenShift chain to open ports in.
		"--create-chain",
	}
	if cfg.Backend == BackendOVS {
		a = append(a, "--ovsdb", "unix:"+n.OVSDBSock, "--bridge", "br0", "--interface", "vxlan0")
	} else {
		a = append(a, "--kernel-device", "flannel.1")
	}
	// The node list is a function of the config (addr.go), so a restarted
	// agent gets the same peers as at Up.
	var nodes []Node
	for i := 1; i <= cfg.Nodes; i++ {
		nodes = append(nodes, newNode(cfg.Name, cfg.Dir, i, cfg.Backend))
	}
	if !cfg.NoProbes && len(nodes) > 1 {
		var peers []string
		for _, p := range ProbePeersOf(n, nodes, cfg.ProbePeers) {
			peers = append(peers, p.Name+"="+netip.AddrPortFrom(p.OverlayIP, ProbePort).String())
		}
		a = append(a,
			"--probe-listen", netip.AddrPortFrom(n.OverlayIP, ProbePort).String(),
			"--probe-peers", strings.Join(peers, ","),
			"--probe-interval", cfg.ProbeInterval.String(),
			"--probe-timeout", cfg.ProbeTimeout.String(),
		)
	}
	if cfg.Insecure {
		a = append(a, "--insecure")
	} else {
		f := pki.AgentFiles(pkiDir, n.Name)
		a = append(a, "--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key)
	}
	return append(a, cfg.ExtraAgentArgs...)
}

// coordinatorArgs is the coordinator's command line; agents come from an
// inventory file so 64 nodes do not make a 64-flag command line.
func coordinatorArgs(cfg Config, inventory, pkiDir string) []string {
	a := []string{
		"--inventory", inventory,
		"--listen", coordinatorAddr(),
		"--metrics-listen", netip.AddrPortFrom(HubMgmt, CoordinatorMetricsPort).String(),
		"--state-dir", filepath.Join(cfg.Dir, "coordinator"),
		// Every lab daemon shares this machine's cores (16 and more
		// processes on 2 in CI, under -race): a node can wake or answer its
		// Commit later than a real node would without anything being wrong.
		// The lab widens the product's lateness budget (200 ms) so that
		// load is not judged a late node, and keeps the product's answer
		// deadline (1 s, under the fault tests' 1.5 s steps); the
		// late-commit tests pass the product's values again (later flags
		// win).
		"--commit-late-budget", "600ms", "--commit-answer-deadline", "1s",
		"--default-strategy", cfg.DefaultStrategy,
	}
	// The coordinator hands the agents the lab's probe sample with Prepare
	// and verifies it; a lab without probes has nothing to verify with.
	if cfg.NoProbes {
		a = append(a, "--probe-verify=false")
	} else {
		a = append(a, "--probe-peers-k", fmt.Sprint(cfg.ProbePeers))
	}
	if cfg.Insecure {
		a = append(a, "--insecure")
	} else {
		f := pki.CoordinatorFiles(pkiDir)
		a = append(a, "--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key)
	}
	return append(a, cfg.ExtraCoordinatorArgs...)
}

// ProbePeersOf is the peers node n probes: all others when k is 0 (or
// covers them all), else a sample of k (pkg/ringsample): the same
// distances both ways around the ring of nodes, so that every node probes
// exactly those that probe it (their answers ride in their probes),
// spread over the ring: a change made node by node in ring order splits
// far pairs too, as a cluster's traffic sees. The ring is in index order;
// the coordinator's sample sets the names sorted, which is the same order
// below 10 nodes only (n10 sorts before n2): from 10 nodes on, a Prepare
// hands some agents peers they did not probe before.
func ProbePeersOf(n Node, nodes []Node, k int) []Node {
	self := -1
	for i, p := range nodes {
		if p.Index == n.Index {
			self = i
		}
	}
	dists := ringsample.Distances(len(nodes), k)
	out := make([]Node, 0, len(dists))
	for _, d := range dists {
		out = append(out, nodes[(self+d)%len(nodes)])
	}
	return out
}

type inventoryFile struct {
	Agents []inventoryAgent `json:"agents"`
}

type inventoryAgent struct {
	Node    string            `json:"node"`
	Address string            `json:"address"`
	Labels  map[string]string `json:"labels"`
}

func (l *Lab) startProcesses(ctx context.Context) error {
	cfg := l.cfg()
	nodes := l.Nodes()
	for _, b := range []struct{ field, path string }{{"AgentBin", cfg.AgentBin}, {"CoordinatorBin", cfg.CoordinatorBin}} {
		if st, err := os.Stat(b.path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return &ConfigError{b.field, b.path, "not an executable file (run `make build` first, or Config.StartProcesses=false)"}
		}
	}
	pkiDir := ""
	if !cfg.Insecure {
		pkiDir = filepath.Join(cfg.Dir, "pki")
		var agents []pki.AgentIdentity
		for _, n := range nodes {
			agents = append(agents, pki.AgentIdentity{Name: n.Name, IPs: []net.IP{n.MgmtIP.AsSlice()}})
		}
		if err := pki.Issue(pkiDir, pki.IssueOptions{Agents: agents, CoordinatorIPs: []net.IP{HubMgmt.AsSlice()}, Validity: 30 * 24 * time.Hour}); err != nil {
			return err
		}
	}
	inv := inventoryFile{}
	for _, n := range nodes {
		inv.Agents = append(inv.Agents, inventoryAgent{Node: n.Name, Address: n.AgentAddr, Labels: map[string]string{"lab": cfg.Name}})
	}
	invPath := filepath.Join(cfg.Dir, "inventory.json")
	data, _ := json.MarshalIndent(inv, "", "  ")
	if err := os.WriteFile(invPath, data, 0o644); err != nil {
		return err
	}
	if err := l.record(func(s *state) { s.PKIDir = pkiDir; s.CoordinatorTCP = coordinatorAddr() }); err != nil {
		return err
	}

	if err := forEach(ctx, len(nodes), cfg.Parallel, func(k int) error {
		n := nodes[k]
		return l.spawn("agent", n.Name, n.Netns, filepath.Join(n.Dir, "agent.log"), cfg.AgentBin, agentArgs(cfg, n, pkiDir)...)
	}); err != nil {
		return err
	}
	if err := l.spawn("coordinator", "hub", HubNetns(cfg.Name), filepath.Join(cfg.Dir, "coordinator.log"), cfg.CoordinatorBin, coordinatorArgs(cfg, invPath, pkiDir)...); err != nil {
		return err
	}
	return l.waitReady(ctx)
}

// spawn starts bin inside namespace ns, its output appended to logPath, and
// records it. `ip netns exec` execs in place: the PID is bin's.
func (l *Lab) spawn(role, node, ns, logPath, bin string, args ...string) error {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer func() { _ = logf.Close() }() // the child holds its own copy
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a ^C at the terminal that ran `lab up` must not
	// take the lab down behind its record's back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lab: start %s %s: %w", role, strings.Join(cmd.Args, " "), err)
	}
	go func() { _ = cmd.Wait() }() // reap while this process lives
	p, err := newProc(role, node, cmd.Process.Pid)
	if err == nil {
		err = l.addProc(p)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	return nil
}

// hubClient is an HTTP client whose connections are made from the hub
// namespace, where every management address is reachable.
func (l *Lab) hubClient() *http.Client {
	hub := HubNetns(l.cfg().Name)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(hub, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 2 * time.Second}
}

// waitReady waits until every agent and the coordinator serve (/healthz
// answers 200), or a process died, or ReadyTimeout. It does not wait for
// /readyz: an agent may serve but not be ready (its backend not set up),
// which Status reports and the coordinator's preflight refuses with reasons.
func (l *Lab) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	c := l.hubClient()
	type target struct{ name, url, log string }
	var ts []target
	for _, n := range l.Nodes() {
		ts = append(ts, target{n.Name + " agent", "http://" + n.Metrics + "/healthz", filepath.Join(n.Dir, "agent.log")})
	}
	ts = append(ts, target{"coordinator", "http://" + netip.AddrPortFrom(HubMgmt, CoordinatorMetricsPort).String() + "/healthz", filepath.Join(l.Dir(), "coordinator.log")})
	last := map[string]string{}
	for {
		var pending []target
		for _, t := range ts {
			if why := get(ctx, c, t.url); why != "" {
				last[t.name] = why
				pending = append(pending, t)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		for _, p := range l.Procs() {
			if (p.Role == "agent" || p.Role == "coordinator") && !p.Alive() {
				return fmt.Errorf("lab: %s exited during start-up; see %s", p, logOf(l, p))
			}
		}
		select {
		case <-ctx.Done():
			var errs []error
			for _, t := range pending {
				errs = append(errs, fmt.Errorf("%s not ready (%s): %s; see %s", t.name, t.url, last[t.name], t.log))
			}
			return fmt.Errorf("lab: not ready after %s: %w", ReadyTimeout, errors.Join(errs...))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func logOf(l *Lab, p Proc) string {
	if p.Role == "coordinator" {
		return filepath.Join(l.Dir(), "coordinator.log")
	}
	return filepath.Join(l.Dir(), p.Node, "agent.log")
}

// get returns "" on 200, else why not.
func get(ctx context.Context, c *http.Client, url string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return strconv.Itoa(resp.StatusCode) + " " + strings.TrimSpace(string(body))
	}
	return ""
}

// CoordctlArgs are the global coordctl flags that reach this lab's
// coordinator: address and TLS identity (role admin), or --insecure.
func (l *Lab) CoordctlArgs() []string {
	a := []string{"--coordinator", coordinatorAddr()}
	if l.cfg().Insecure {
		return append(a, "--insecure")
	}
	f := pki.AdminFiles(l.PKIDir())
	return append(a, "--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key)
}

// CoordctlCommand runs coordctl against the lab's coordinator. It runs in
// the hub namespace: the coordinator listens on the management network
// only, which the host namespace cannot reach.
func (l *Lab) CoordctlCommand(ctx context.Context, coordctl string, args ...string) (*exec.Cmd, error) {
	return l.Command(ctx, "hub", append(append([]string{coordctl}, l.CoordctlArgs()...), args...)...)
}

// Status is a lab's state read back from the system (not from the record).
type Status struct {
	Name, Backend, Dir, Phase string
	Coordinator               string // gRPC address, "" without processes
	Nodes                     []NodeStatus
	Procs                     []ProcStatus
}

// NodeStatus is one node's state.
type NodeStatus struct {
	Name, Netns string
	NetnsExists bool
	Port        int    // VXLAN port read from the dataplane; 0 when unreadable
	PortErr     string // why Port could not be read
	AgentReady  string // "ok", the agent's /readyz reasons, or "" without agents
}

// ProcStatus is a recorded process and whether it still runs.
type ProcStatus struct {
	Proc
	Alive bool
}

// String is a compact human report.
func (s Status) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lab %s (%s, %d nodes) in %s: %s\n", s.Name, s.Backend, len(s.Nodes), s.Dir, s.Phase)
	if s.Coordinator != "" {
		fmt.Fprintf(&b, "coordinator %s\n", s.Coordinator)
	}
	for _, n := range s.Nodes {
		port := strconv.Itoa(n.Port)
		if n.PortErr != "" {
			port = "? (" + n.PortErr + ")"
		}
		fmt.Fprintf(&b, "%-4s netns=%t port=%s", n.Name, n.NetnsExists, port)
		if n.AgentReady != "" {
			fmt.Fprintf(&b, " agent=%s", strings.ReplaceAll(n.AgentReady, "\n", "; "))
		}
		b.WriteString("\n")
	}
	for _, p := range s.Procs {
		state := "running"
		if !p.Alive {
			state = "GONE"
		}
		fmt.Fprintf(&b, "%s %s\n", p.Proc, state)
	}
	return b.String()
}

// Status reads the lab's state back: namespaces, each node's VXLAN port
// from its dataplane, each recorded process, and agent readiness.
func (l *Lab) Status(ctx context.Context) (Status, error) {
	l.mu.Lock()
	st := Status{Name: l.st.Config.Name, Backend: l.st.Config.Backend, Dir: l.st.Config.Dir, Phase: l.st.Phase, Coordinator: l.st.CoordinatorTCP}
	l.mu.Unlock()
	hasAgents := false
	for _, p := range l.Procs() {
		st.Procs = append(st.Procs, ProcStatus{p, p.Alive()})
		hasAgents = hasAgents || p.Role == "agent"
	}
	c := l.hubClient()
	for _, n := range l.Nodes() {
		ns := NodeStatus{Name: n.Name, Netns: n.Netns, NetnsExists: netns.Exists(n.Netns)}
		if ns.NetnsExists {
			if p, err := l.Port(ctx, n.Name); err != nil {
				ns.PortErr = err.Error()
			} else {
				ns.Port = p
			}
		} else {
			ns.PortErr = "no namespace"
		}
		if hasAgents {
			ns.AgentReady = "ok"
			if why := get(ctx, c, "http://"+n.Metrics+"/readyz"); why != "" {
				ns.AgentReady = why
			}
		}
		st.Nodes = append(st.Nodes, ns)
	}
	return st, nil
}
