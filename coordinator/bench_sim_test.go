package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fakeagent"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// simScaleResult is one row of results/coordinator_scale_sim.json.
type simScaleResult struct {
	Agents        int     `json:"agents"`
	Strategy      string  `json:"strategy"`
	State         string  `json:"state"`
	PreflightMs   float64 `json:"preflight_ms"`
	PrepareMs     float64 `json:"prepare_ms"`
	CommitMs      float64 `json:"commit_ms"` // atomic: includes the commit lead
	VerifyMs      float64 `json:"verify_ms"`
	ConfirmMs     float64 `json:"confirm_ms"`
	FinalizeMs    float64 `json:"finalize_ms"`
	PFPrepComVer  float64 `json:"preflight_prepare_commit_verify_ms"`
	SpreadMs      float64 `json:"commit_spread_ms"`
	LeadMs        float64 `json:"commit_lead_ms"`              // the instant minus when the fan-out started
	LastApplyMs   float64 `json:"last_apply_after_instant_ms"` // the latest agent's apply minus the instant: the simulated agents' wake-ups on shared cores
	MarginMs      float64 `json:"commit_margin_ms"`            // the instant minus the latest Commit arrival (Report.commit_margin_nanos): > 0 when the fan-out was done in time
	TotalMs       float64 `json:"total_ms"`
	CPUSeconds    float64 `json:"process_cpu_s"` // user+system of the process (coordinator and the simulated agents) during the operation
	MaxRSSMB      float64 `json:"process_max_rss_mb"`
	HeapMB        float64 `json:"heap_mb"`
	GoroutinesEnd int     `json:"goroutines"`
}

// BenchmarkCoordinatorScaleSim runs one cutover with the real coordinator
// over N cheap simulated agents (coordinator/internal/fakeagent: every
// RPC answered from memory, the probe mesh simulated), each its own gRPC
// server on an in-memory listener, so that what is measured is the
// coordinator: its fan-outs, clock sampling, journal writes and the
// barrier core (issue 13: preflight + prepare + commit + verify <= 1 s at
// 1,000 agents and <= 5 s at 10,000, the commit fan-out done before the
// instant). Sizes: COT_SCALE_SIM_SIZES (default "1000,10000"). Writes
// $CUTOVER_RESULTS/coordinator_scale_sim.json (default results/).
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
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			for b.Loop() {
				row := runScaleSim(b, n)
				rows = append(rows, row)
				b.Logf("N=%d %s: preflight %.0f prepare %.0f commit %.0f (lead %.0f ms, the last Commit arrived %.1f ms before the instant, the last apply %.1f ms after it) verify %.0f confirm %.0f finalize %.0f ms; pf+prep+commit+verify %.0f ms; spread %.3f ms; CPU %.1f s, max RSS %.0f MB, heap %.0f MB",
					n, row.State, row.PreflightMs, row.PrepareMs, row.CommitMs, row.LeadMs, row.MarginMs, row.LastApplyMs, row.VerifyMs, row.ConfirmMs, row.FinalizeMs, row.PFPrepComVer, row.SpreadMs, row.CPUSeconds, row.MaxRSSMB, row.HeapMB)
			}
		})
	}
	dir := os.Getenv("CUTOVER_RESULTS")
	if dir == "" {
		dir = filepath.Join("..", "results")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	out, _ := json.MarshalIndent(map[string]any{
		"benchmark": "BenchmarkCoordinatorScaleSim",
		"setup":     "real coordinator, simulated agents (fakeagent) each with its own gRPC server over bufconn, insecure, GOMAXPROCS=" + fmt.Sprint(runtime.GOMAXPROCS(0)),
		"targets":   map[string]string{"preflight_prepare_commit_verify_ms": "<= 1000 at 1000 agents, <= 5000 at 10000", "last_apply_after_instant_ms": "~0 at 10000 (the commit fan-out lands before the instant)"},
		"results":   rows,
	}, "", "  ")
	p := filepath.Join(dir, "coordinator_scale_sim.json")
	if err := os.WriteFile(p, append(out, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("coordinator scale (simulated agents) written to %s\n%s\n", p, out)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxRSSMB() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024 // KiB on Linux
}

func runScaleSim(b *testing.B, n int) simScaleResult {
	root := b.TempDir()
	lis := make(map[string]*bufconn.Listener, n)
	var specs []AgentSpec
	for i := range n {
		node := fmt.Sprintf("n%05d", i)
		// 198.18.0.0/15 holds 131,072 addresses: never dialled, mapped to
		// the in-memory listeners below.
		addr := fmt.Sprintf("198.18.%d.%d:9443", i/250, 1+i%250)
		l := bufconn.Listen(64 << 10)
		s := grpc.NewServer()
		agentv1.RegisterAgentServiceServer(s, fakeagent.New(node, fromPort))
		go func() { _ = s.Serve(l) }()
		b.Cleanup(s.Stop)
		lis[addr] = l
		specs = append(specs, AgentSpec{Node: node, Address: addr})
	}
	inv, err := NewInventory("bench-sim", specs)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Default()
	cfg.StateDir, cfg.Insecure = filepath.Join(root, "coordinator"), true
	cfg.StepTimeout = time.Minute
	// The lateness check judges the agents' wake-ups at the instant: here
	// thousands of simulated agents waking on 2 shared cores, not what is
	// measured. The fan-out's own timeliness is the report's commit margin.
	cfg.LateBudget = 5 * time.Second
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no simulated agent at %s", addr)
	})
	c, err := New(cfg, inv, WithDialOptions(dial, grpc.WithTransportCredentials(insecure.NewCredentials())),
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
	// Connections up and every agent ready: the first ListAgents dials
	// them all (a coordinator that has run before has them open).
	if _, err := client.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{}); err != nil {
		b.Fatal(err)
	}
	cpu0 := cpuTime()
	st, err := client.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889, OperationId: fmt.Sprintf("sim-%d", n), TimeoutMillis: time.Minute.Milliseconds()})
	if err != nil {
		b.Fatal(err)
	}
	rep, _, err := drain(st)
	if err != nil {
		b.Fatal(err)
	}
	cpu := cpuTime() - cpu0
	if rep.State != succeeded {
		b.Fatalf("cutover %s: %s (commit margin %v, lead %v, phases %v)", rep.State, rep.Error, time.Duration(rep.CommitMarginNanos), time.Duration(rep.CommitUnixNano-rep.StartedUnixNano), rep.Phases)
	}
	instant := rep.CommitUnixNano
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	row := simScaleResult{Agents: n, MarginMs: float64(rep.CommitMarginNanos) / 1e6, Strategy: "atomic", State: rep.State.String(), SpreadMs: float64(rep.CommitSpreadNanos) / 1e6,
		TotalMs: float64(rep.EndedUnixNano-rep.StartedUnixNano) / 1e6, HeapMB: float64(ms.HeapAlloc) / (1 << 20),
		CPUSeconds: cpu.Seconds(), MaxRSSMB: maxRSSMB(), GoroutinesEnd: runtime.NumGoroutine()}
	at := rep.StartedUnixNano
	for _, p := range rep.Phases {
		v := float64(p.Nanos) / 1e6
		switch p.Phase {
		case "preflight":
			row.PreflightMs = v
		case "prepare":
			row.PrepareMs = v
		case "commit":
			row.CommitMs = v
			row.LeadMs = float64(instant-at) / 1e6
		case "verify":
			row.VerifyMs = v
		case "confirm":
			row.ConfirmMs = v
		case "finalize":
			row.FinalizeMs = v
		}
		at += p.Nanos
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
