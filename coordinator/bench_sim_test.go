package coordinator

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/pkg/callstream"
	"github.com/cutover-dev/cutover/pkg/pki"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// simScaleResult is one row of results/coordinator_scale_sim.json.
type simScaleResult struct {
	Agents int `json:"agents"`
	// Host is where the simulated agents run: "in-process" (in-memory
	// listeners, one heap with the coordinator) or "process" (a second
	// process, loopback TCP: the coordinator's CPU and RSS its own).
	Host     string `json:"agents_host"`
	Sampling string `json:"clock_sampling"` // "bounded" (the defaults) or "unbounded" (as before the sampling was bounded)
	// Conns is "warm" (the agent connections open before the operation,
	// as on a coordinator that ran one within gRPC's 30-minute idle
	// timeout) or "cold" (every connection dialled inside the preflight,
	// as after that timeout); TLS says whether they are mTLS (ECDSA P-256,
	// TLS 1.3, pkg/pki) or plaintext (--insecure). "warmed": opened by
	// WarmAgents (as the coordinator binary does when it starts or takes
	// the lead) before the operation, WarmMs after it started.
	Conns    string  `json:"connections"`
	TLS      bool    `json:"tls"`
	WarmMs   float64 `json:"warm_agents_ms,omitempty"`
	Strategy string  `json:"strategy"`
	State    string  `json:"state"`

	PreflightMs  float64 `json:"preflight_ms"`
	PrepareMs    float64 `json:"prepare_ms"`
	CommitMs     float64 `json:"commit_ms"` // atomic: includes the commit lead
	VerifyMs     float64 `json:"verify_ms"`
	ConfirmMs    float64 `json:"confirm_ms"`
	FinalizeMs   float64 `json:"finalize_ms"`
	PFPrepComVer float64 `json:"preflight_prepare_commit_verify_ms"`
	SpreadMs     float64 `json:"commit_spread_ms"`
	LeadMs       float64 `json:"commit_lead_ms"`              // the instant minus the commit phase's start
	MarginMs     float64 `json:"commit_margin_ms"`            // the instant minus the latest Commit arrival (Report.commit_margin_nanos): > 0 when the fan-out was done in time
	LastApplyMs  float64 `json:"last_apply_after_instant_ms"` // the latest agent's apply minus the instant: the simulated agents' wake-ups on shared cores
	TotalMs      float64 `json:"total_ms"`
	ClockRTTMs   float64 `json:"worst_clock_rtt_ms"` // the largest of the agents' best clock round trips (a ListAgents on warm connections before the run; 0 when cold)

	// CPU (user+system during the operation) and peak RSS of the
	// benchmark's process: the coordinator's alone when Host is "process",
	// the coordinator's and the agents' together when "in-process".
	CPUSeconds float64 `json:"process_cpu_s"`
	MaxRSSMB   float64 `json:"process_max_rss_mb"`
	HeapMB     float64 `json:"heap_mb"`
	// Calls the coordinator made per agent during the operation, by
	// method (a unary client interceptor counts them).
	CallsPerAgent map[string]float64 `json:"calls_per_agent"`
	// The simulated agents' process (Host "process").
	AgentsCPUSeconds float64 `json:"agents_cpu_s,omitempty"`
	AgentsMaxRSSMB   float64 `json:"agents_max_rss_mb,omitempty"`
}

// simHostEnv makes the test binary the simulated agents' process
// (TestMain): the coordinator under measurement then has a process, a heap
// and a garbage collector of its own, as it would in a cluster.
const simHostEnv = "COT_SIM_AGENT_HOST"

func TestMain(m *testing.M) {
	if v := os.Getenv(simHostEnv); v != "" {
		os.Exit(simAgentHost(v))
	}
	os.Exit(m.Run())
}

// BenchmarkCoordinatorScaleSim runs one cutover with the real coordinator
// over N cheap simulated agents (harness/fakeagent: every
// RPC answered from memory, the probe mesh simulated), each its own gRPC
// server, so that what is measured is the coordinator: its fan-outs, clock
// sampling, journal writes and the barrier core (the scale targets: preflight +
// prepare + commit + verify <= 1 s at 1,000 agents and <= 5 s at 10,000,
// the commit fan-out done before the instant). Each size runs three ways
// in the same run: the agents in-process on in-memory listeners (the
// targets' setting) with the clock sampling's defaults, the same as the
// sampling was before they existed (every agent at once, every sample),
// and the defaults with the agents in a second process on loopback TCP,
// where the process's CPU and RSS are the coordinator's own. Sizes: COT_SCALE_SIM_SIZES
// (default "1000,10000"). Writes $CUTOVER_RESULTS/coordinator_scale_sim.json
// (default results/).
func BenchmarkCoordinatorScaleSim(b *testing.B) {
	var rows []simScaleResult
	sizes := strings.Split(os.Getenv("COT_SCALE_SIM_SIZES"), ",")
	if sizes[0] == "" {
		sizes = []string{"1000", "10000"}
	}
	for _, s := range sizes {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("COT_SCALE_SIM_SIZES: %q: %v", s, err)
		}
		for _, way := range []simWay{{"in-process", "bounded", "warm", false}, {"in-process", "unbounded", "warm", false}, {"process", "bounded", "warm", false},
			{"in-process", "bounded", "cold", false}, {"in-process", "bounded", "cold", true}, {"in-process", "bounded", "warmed", true}} {
			if os.Getenv("COT_SCALE_SIM_WARM_ONLY") != "" && (way.conns != "warm" || way.tls) {
				continue // make bench-coordinator-ab compares the warm rows alone
			}
			name := fmt.Sprintf("agents=%d/host=%s/sampling=%s", n, way.host, way.sampling)
			if way.conns != "warm" || way.tls {
				name += fmt.Sprintf("/conns=%s/tls=%t", way.conns, way.tls)
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					row := runScaleSim(b, n, way)
					rows = append(rows, row)
					b.Logf("N=%d agents %s, %s sampling, %s connections, TLS %t, %s: preflight %.0f prepare %.0f commit %.0f (lead %.0f ms, the last Commit arrived %.1f ms before the instant, the last apply %.1f ms after it) verify %.0f confirm %.0f finalize %.0f ms; pf+prep+commit+verify %.0f ms; spread %.3f ms; worst clock RTT %.2f ms; process CPU %.1f s, max RSS %.0f MB, heap %.0f MB; agents' process CPU %.1f s, RSS %.0f MB; calls per agent %v; WarmAgents before it %.0f ms",
						n, way.host, way.sampling, way.conns, way.tls, row.State, row.PreflightMs, row.PrepareMs, row.CommitMs, row.LeadMs, row.MarginMs, row.LastApplyMs, row.VerifyMs, row.ConfirmMs, row.FinalizeMs, row.PFPrepComVer, row.SpreadMs, row.ClockRTTMs,
						row.CPUSeconds, row.MaxRSSMB, row.HeapMB, row.AgentsCPUSeconds, row.AgentsMaxRSSMB, row.CallsPerAgent, row.WarmMs)
				}
			})
		}
	}
	benchresult.Save(b, "coordinator_scale_sim.json", map[string]any{
		"benchmark": "BenchmarkCoordinatorScaleSim",
		"setup": "real coordinator in the benchmark's process; simulated agents (fakeagent), each its own gRPC server, in-process on in-memory listeners or in a second process on loopback TCP ports (agents_host); plaintext unless tls (mTLS, ECDSA P-256, TLS 1.3); connections warm (opened before the operation) unless cold (dialled in its preflight); GOMAXPROCS=" + fmt.Sprint(runtime.GOMAXPROCS(0)) +
			" in each process, everything sharing the machine's cores; unbounded = --clock-parallel 4096 --clock-good-rtt 0 (every agent sampled at once, every sample taken: as before the sampling was bounded)",
		"targets": map[string]string{"preflight_prepare_commit_verify_ms": "<= 1000 at 1000 agents, <= 5000 at 10000", "commit_margin_ms": "> 0 at 10000 (the commit fan-out lands before the instant)"},
		"results": rows,
	})
}

// raiseNoFile lifts the open-file limit to at least want (root may raise
// the hard limit too): 10,000 agents are 10,000 connections on each side.
func raiseNoFile(want uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= want {
		return nil
	}
	l.Cur, l.Max = want, max(l.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("open-file limit to %d: %w (run as root, or raise ulimit -n)", want, err)
	}
	return nil
}

// simAgentHost serves count simulated agents behind one loopback TCP
// listener (a process may hold fewer descriptors than 10,000 listeners
// and their connections): a connection names its agent in its first line
// (simNode's fixed length) and is then handed to that agent's gRPC server. It prints the
// listener's address, and serves until its stdin closes.
func simAgentHost(count string) int {
	n, err := strconv.Atoi(count)
	if err == nil {
		err = raiseNoFile(uint64(n + 1024))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulated agents:", err)
		return 2
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulated agents:", err)
		return 2
	}
	agents := make(map[string]*handoff, n)
	for i := range n {
		node := simNode(i)
		h := &handoff{addr: l.Addr(), conns: make(chan net.Conn, 16)}
		agents[node] = h
		s := grpc.NewServer(callstream.ServerOptions()...) // as the agent serves
		fakeagent.Register(s, simAgent(node))
		go func() { _ = s.Serve(h) }()
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				// The name's exact length, unbuffered: what follows is
				// the gRPC client's, not ours to read.
				name := make([]byte, len(simNode(0))+1)
				_, err := io.ReadFull(c, name)
				h := agents[strings.TrimSuffix(string(name), "\n")]
				if err != nil || h == nil {
					_ = c.Close()
					return
				}
				h.conns <- c
			}()
		}
	}()
	fmt.Println(l.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// handoff is a net.Listener fed the connections for one agent.
type handoff struct {
	addr  net.Addr
	conns chan net.Conn
}

func (h *handoff) Accept() (net.Conn, error) {
	c, ok := <-h.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (h *handoff) Close() error   { return nil }
func (h *handoff) Addr() net.Addr { return h.addr }

// simAgent is one simulated agent; its path check lasts as long as a real
// agent's (the start lead and the window are part of every preflight).
func simAgent(node string) *fakeagent.Agent {
	a := fakeagent.New(node, fromPort)
	a.SetPathTiming(true)
	return a
}

// simNode and simAddr name the i-th simulated agent and give it an
// address of its own: 198.18.0.0/15 holds 131,072, never dialled (the
// dialers below map them).
func simNode(i int) string { return fmt.Sprintf("n%05d", i) }
func simAddr(i int) string { return fmt.Sprintf("198.18.%d.%d:9443", i/250, 1+i%250) }

// simAgents starts the simulated agents' process and returns its agents,
// the dial option that reaches them, and the process, stopped (through
// its stdin, else killed by its PID) when b ends.
func simAgents(b *testing.B, n int) ([]AgentSpec, grpc.DialOption, *os.Process) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", simHostEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("simulated agents: %v", err)
	}
	host := strings.TrimSpace(line)
	nodes := make(map[string]string, n)
	var specs []AgentSpec
	for i := range n {
		nodes[simAddr(i)] = simNode(i)
		specs = append(specs, AgentSpec{Node: simNode(i), Address: simAddr(i)})
	}
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		node, ok := nodes[addr]
		if !ok {
			return nil, fmt.Errorf("no simulated agent at %s", addr)
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", host)
		if err == nil {
			_, err = io.WriteString(c, node+"\n")
		}
		return c, err
	})
	return specs, dial, cmd.Process
}

// procCPU and procMaxRSSMB read a process's CPU time and peak RSS (nil:
// this one's RSS).
func procCPU(p *os.Process) time.Duration {
	if p == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func procMaxRSSMB(p *os.Process) float64 {
	f := "/proc/self/status"
	if p != nil {
		f = fmt.Sprintf("/proc/%d/status", p.Pid)
	}
	b, _ := os.ReadFile(f)
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeakRSS restarts this process's peak RSS (VmHWM) from its current
// RSS, so that each size's figure is its own, not an earlier run's.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// simWay is one way of running BenchmarkCoordinatorScaleSim.
type simWay struct {
	host, sampling, conns string
	tls                   bool
}

// simPKI issues a lab PKI (pkg/pki, as `cutover-lab` and the deploy docs
// do) and returns the simulated agents' server options and the
// coordinator's dial option: every agent presents the same certificate,
// which costs a handshake what one per agent would.
func simPKI(b *testing.B) ([]grpc.ServerOption, grpc.DialOption) {
	dir := b.TempDir()
	if err := pki.Issue(dir, pki.IssueOptions{Agents: []pki.AgentIdentity{{Name: "sim-agent"}}, Validity: 24 * time.Hour}); err != nil {
		b.Fatal(err)
	}
	srv, err := pki.ServerConfig(pki.AgentFiles(dir, "sim-agent"), pki.RoleCoordinator)
	if err != nil {
		b.Fatal(err)
	}
	cli, err := pki.ClientConfig(pki.CoordinatorFiles(dir), pki.RoleAgent)
	if err != nil {
		b.Fatal(err)
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srv))}, grpc.WithTransportCredentials(credentials.NewTLS(cli))
}

// inProcessAgents serves n simulated agents on in-memory listeners and
// returns them with the dial option that reaches them.
func inProcessAgents(b *testing.B, n int, opts ...grpc.ServerOption) ([]AgentSpec, grpc.DialOption) {
	opts = append(callstream.ServerOptions(), opts...) // as the agent serves
	lis := make(map[string]*bufconn.Listener, n)
	var specs []AgentSpec
	for i := range n {
		node, addr := simNode(i), simAddr(i)
		l := bufconn.Listen(64 << 10)
		s := grpc.NewServer(opts...)
		fakeagent.Register(s, simAgent(node))
		go func() { _ = s.Serve(l) }()
		b.Cleanup(s.Stop)
		lis[addr] = l
		specs = append(specs, AgentSpec{Node: node, Address: addr})
	}
	return specs, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no simulated agent at %s", addr)
	})
}

func runScaleSim(b *testing.B, n int, way simWay) simScaleResult {
	host, sampling := way.host, way.sampling
	var (
		specs  []AgentSpec
		agents *os.Process
		calls  sync.Map // method → *atomic.Int64
		dial   []grpc.DialOption
		count  = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			v, _ := calls.LoadOrStore(path.Base(method), new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	)
	if host == "process" {
		if err := raiseNoFile(uint64(n + 1024)); err != nil {
			b.Fatal(err)
		}
		var d grpc.DialOption
		specs, d, agents = simAgents(b, n)
		dial = append(dial, d, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		var d grpc.DialOption
		var sopts []grpc.ServerOption
		creds := grpc.WithTransportCredentials(insecure.NewCredentials())
		if way.tls {
			sopts, creds = simPKI(b)
		}
		specs, d = inProcessAgents(b, n, sopts...)
		dial = append(dial, d, creds)
	}
	inv, err := NewInventory("bench-sim", specs)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Default()
	cfg.StateDir, cfg.Insecure = filepath.Join(b.TempDir(), "coordinator"), true
	cfg.StepTimeout = time.Minute
	// The lateness check judges the agents' wake-ups at the instant: here
	// thousands of simulated agents waking on 2 shared cores, not what is
	// measured. The fan-out's own timeliness is the report's commit margin.
	cfg.LateBudget = 5 * time.Second
	if sampling == "unbounded" {
		cfg.ClockParallel, cfg.ClockGoodRTT = 4096, 0
	}
	c, err := New(cfg, inv, WithDialOptions(dial...), WithAgentCallInterceptor(count),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	api := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Serve(srv, c)
	go func() { _ = srv.Serve(api) }()
	defer srv.Stop()
	// As coordctl dials (cli.MaxReportBytes): the report of 10,000 nodes
	// is more than gRPC's default 4 MiB.
	cc, err := grpc.NewClient("passthrough:///coordinator", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return api.DialContext(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	client := coordinatorv1.NewCoordinatorServiceClient(cc)
	ctx := context.Background()
	// Warm: connections up and every agent ready, as on a coordinator
	// that ran an operation within gRPC's idle timeout: the first
	// ListAgents dials them all, and the second's clock samples, on warm
	// connections, give the worst RTT. Cold: the operation dials them.
	var worstRTT int64
	var warmMs float64
	if way.conns == "warmed" {
		// As the coordinator binary does at start: WarmAgents, at most
		// warmParallel handshakes at once, in the background; the
		// benchmark waits for it and reports how long it took.
		t0 := time.Now()
		c.WarmAgents()
		for _, spec := range specs {
			for c.fleet.Agent(spec.Node).Conn.GetState() != connectivity.Ready {
				if time.Since(t0) > 5*time.Minute {
					b.Fatalf("%s not connected 5 minutes after WarmAgents", spec.Node)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		warmMs = float64(time.Since(t0)) / 1e6
	}
	if way.conns == "warm" {
		if _, err := client.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{}); err != nil {
			b.Fatal(err)
		}
		la, err := client.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{})
		if err != nil {
			b.Fatal(err)
		}
		for _, a := range la.Agents {
			if a.Error != "" {
				b.Fatalf("agent %s: %s", a.Node, a.Error)
			}
			worstRTT = max(worstRTT, a.RttNanos)
		}
	}
	debug.FreeOSMemory() // what an earlier size left behind is not this one's
	resetPeakRSS()
	calls.Clear()
	cpu0, acpu0 := cpuTime(), procCPU(agents)
	stopProfile := profileOperation(b)
	defer stopProfile() // a refused operation returns early
	t0 := time.Now()
	st, err := client.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889, OperationId: fmt.Sprintf("sim-%d", n), Strategy: StrategyAtomic, TimeoutMillis: time.Minute.Milliseconds()})
	if err != nil {
		b.Fatal(err)
	}
	rep, _, err := drain(st)
	if err != nil && way.conns == "cold" {
		// Cold, the preflight's handshakes may time out: what this row
		// shows. The refusal is recorded, not a failure of the benchmark.
		msg, _, _ := strings.Cut(status.Convert(err).Message(), "\n")
		// One agent's reason, as preflight gave it: why they failed.
		var why string
		if _, after, ok := strings.Cut(err.Error(), "unreachable: "); ok {
			why, _, _ = strings.Cut(after, "\n")
			why = "; first: " + why
		}
		return simScaleResult{Agents: n, Host: host, Sampling: sampling, Conns: way.conns, TLS: way.tls, Strategy: "atomic",
			State:       fmt.Sprintf("REFUSED: %s (%d agents unreachable%s)", msg, strings.Count(err.Error(), "unreachable"), why),
			PreflightMs: float64(time.Since(t0)) / 1e6, CPUSeconds: (cpuTime() - cpu0).Seconds(), MaxRSSMB: procMaxRSSMB(nil)}
	}
	if err != nil {
		b.Fatal(err)
	}
	stopProfile()
	cpu, acpu := cpuTime()-cpu0, procCPU(agents)-acpu0
	if rep.State != succeeded {
		b.Fatalf("cutover %s: %s (commit margin %v)", rep.State, rep.Error, time.Duration(rep.CommitMarginNanos))
	}
	instant := rep.CommitUnixNano
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	row := simScaleResult{Agents: n, Host: host, Sampling: sampling, Conns: way.conns, TLS: way.tls, WarmMs: warmMs, Strategy: "atomic", State: rep.State.String(),
		SpreadMs: float64(rep.CommitSpreadNanos) / 1e6, MarginMs: float64(rep.CommitMarginNanos) / 1e6,
		TotalMs: float64(rep.EndedUnixNano-rep.StartedUnixNano) / 1e6, ClockRTTMs: float64(worstRTT) / 1e6,
		CPUSeconds: cpu.Seconds(), MaxRSSMB: procMaxRSSMB(nil), HeapMB: float64(ms.HeapAlloc) / (1 << 20),
		AgentsCPUSeconds: acpu.Seconds()}
	if agents != nil {
		row.AgentsMaxRSSMB = procMaxRSSMB(agents)
	}
	row.CallsPerAgent = map[string]float64{}
	calls.Range(func(k, v any) bool {
		row.CallsPerAgent[k.(string)] = float64(v.(*atomic.Int64).Load()) / float64(n)
		return true
	})
	for _, p := range rep.Phases {
		v := float64(p.Nanos) / 1e6
		switch p.Phase {
		case "preflight":
			row.PreflightMs = v
		case "prepare":
			row.PrepareMs = v
		case "commit":
			row.CommitMs = v
			row.LeadMs = float64(instant-p.StartedUnixNano) / 1e6
		case "verify":
			row.VerifyMs = v
		case "confirm":
			row.ConfirmMs = v
		case "finalize":
			row.FinalizeMs = v
		}
	}
	var last int64
	for _, nr := range rep.Nodes {
		last = max(last, nr.AppliedUnixNano)
	}
	if instant != 0 && last != 0 {
		row.LastApplyMs = float64(last-instant) / 1e6
	}
	row.PFPrepComVer = row.PreflightMs + row.PrepareMs + row.CommitMs + row.VerifyMs
	return row
}

// profileOperation writes a CPU profile of the operation alone (not the
// agents' setup) to $COT_SCALE_SIM_CPUPROFILE when it is set: how
// docs/benchmarks.md's "Where the time goes" was taken. Off by default.
// Every row writes the same file: pick one row with -bench. stop may be
// called more than once.
func profileOperation(b *testing.B) (stop func()) {
	path := os.Getenv("COT_SCALE_SIM_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				b.Error(err)
			}
		})
	}
}
