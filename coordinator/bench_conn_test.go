package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// connMemResult is one row of results/agent_conn_memory.json.
type connMemResult struct {
	Connections int     `json:"connections"`
	HeapInuseMB float64 `json:"heap_inuse_mb"` // after a GC, above the same process without them
	StackMB     float64 `json:"stack_inuse_mb"`
	Goroutines  int     `json:"goroutines"`
}

// BenchmarkAgentConnMemory measures what the coordinator holds for its
// agent connections while they are open and idle: N simulated
// agents in a second process (COT_CONN_MEM_AGENTS, default 10,000), one
// connection each dialled by the fleet and used once (an Info), then the
// heap and the goroutine stacks in use after a GC, above the same process
// before the dial; twice. Writes $CUTOVER_RESULTS/agent_conn_memory.json.
func BenchmarkAgentConnMemory(b *testing.B) {
	n := 10000
	if v := os.Getenv("COT_CONN_MEM_AGENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("COT_CONN_MEM_AGENTS: %q: want a count of agents", v)
		}
	}
	if err := raiseNoFile(uint64(n + 1024)); err != nil {
		b.Fatal(err)
	}
	specs, hostDial, agents := simAgents(b, n)
	defer func() { _ = agents.Kill() }()
	inv, err := NewInventory("bench-conn", specs)
	if err != nil {
		b.Fatal(err)
	}
	var rows []connMemResult
	for b.Loop() {
		for range 2 {
			row := connMemory(b, inv, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), hostDial})
			b.Logf("%d connections open and idle hold %.0f MB of heap and %.0f MB of stacks (%d goroutines)",
				row.Connections, row.HeapInuseMB, row.StackMB, row.Goroutines)
			rows = append(rows, row)
		}
	}
	benchresult.Save(b, "agent_conn_memory.json", map[string]any{
		"benchmark": "BenchmarkAgentConnMemory",
		"setup": fmt.Sprintf("%d simulated agents (fakeagent) in a second process behind one loopback listener; the coordinator's fleet with insecure credentials; each connection used once (Info) then idle; "+
			"heap_inuse and stack_inuse after runtime.GC, minus the same before dialling; GOMAXPROCS=%d", n, runtime.GOMAXPROCS(0)),
		"results": rows,
	})
}

// connMemory dials every agent of inv with opts, makes one call on each,
// and returns what the open, idle connections hold; then closes them.
func connMemory(b *testing.B, inv Inventory, opts []grpc.DialOption) connMemResult {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	fl, err := fleet.New(inv, nil, opts, callstream.Options{}, fleet.Clock{Parallel: 1}, slog.Default())
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		fl.Close()
		time.Sleep(time.Second) // the transports' goroutines end
	}()
	var conns []*fleet.Agent
	for _, n := range inv.NodeNames() {
		conns = append(conns, fl.Agent(n))
	}
	sem := make(chan struct{}, 64)
	errs := make(chan error, len(conns))
	for _, a := range conns {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := a.Client.Info(ctx, &agentv1.InfoRequest{})
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return connMemResult{
		Connections: len(conns),
		HeapInuseMB: float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / (1 << 20),
		StackMB:     float64(int64(after.StackInuse)-int64(before.StackInuse)) / (1 << 20),
		Goroutines:  runtime.NumGoroutine() - g0,
	}
}
