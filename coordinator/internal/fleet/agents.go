package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// Agent is the client side of one agent.
type Agent struct {
	Spec   model.AgentSpec
	Conn   *grpc.ClientConn
	Calls  *callstream.Conn // client's calls: one stream on conn
	Client agentv1.AgentServiceClient
}

// dial opens a lazy client to every agent. grpc.NewClient does not
// connect until the first call (or WarmAgents), so an unreachable agent
// shows up in preflight, not here. The passthrough scheme skips DNS: addresses are node
// IPs (R6 in docs/design.md: the control path uses host networking).
//
// Reconnection back-off is capped at 1 s (gRPC's default grows to 2 min):
// calls fail fast while a channel waits to reconnect, so an agent that
// restarted would otherwise look unreachable to the rollback's retries for
// long after it is back. A handful of agents reconnecting every second
// costs nothing. The flow-control windows are fixed (callstream.
// DialOptions: no bandwidth-delay pings beside every answer). Options
// given by the caller come after and win.
func dial(inv model.Inventory, opts []grpc.DialOption, callOpts callstream.Options) (map[string]*Agent, error) {
	opts = append(append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	})}, callstream.DialOptions()...), opts...)
	out := map[string]*Agent{}
	for _, s := range inv.Agents {
		cc, err := grpc.NewClient("passthrough:///"+s.Address, opts...)
		if err != nil {
			for _, a := range out {
				_ = a.Conn.Close()
			}
			return nil, fmt.Errorf("agent %s at %s: %w", s.Node, s.Address, err)
		}
		// The calls go over one stream per agent (pkg/callstream): at
		// 10,000 agents a stream per call cost more than the calls'
		// messages. An older agent is called unary.
		calls := callstream.NewConn(cc, agentv1.AgentService_Calls_FullMethodName, callOpts)
		out[s.Node] = &Agent{Spec: s, Conn: cc, Calls: calls, Client: agentv1.NewAgentServiceClient(calls)}
	}
	return out, nil
}

// ClockSample is one agent's offset estimate.
type ClockSample struct {
	Offset time.Duration // agent clock − coordinator clock
	RTT    time.Duration
}

// FanOut runs f for every node in parallel and waits, on fanWorkers.
func FanOut(nodes []string, f func(node string)) {
	var wg sync.WaitGroup
	wg.Add(len(nodes))
	for _, n := range nodes {
		fanWorkers.run(func() {
			defer wg.Done()
			f(n)
		})
	}
	wg.Wait()
}

// fanWorkers are the fan-outs' goroutines, kept for fanWorkerIdle after
// their last function: the operation's next round reuses them.
var fanWorkers = &workers{idle: fanWorkerIdle, work: make(chan func())}

// fanWorkerIdle outlasts the gaps between an operation's rounds (the path
// check's window, the commit's lead), a second or two at 10,000 nodes.
const fanWorkerIdle = 10 * time.Second

// workers runs each function at once on a goroutine of its own: an idle
// one if there is, else a new one. There are never fewer goroutines than
// functions running, so no call waits for another: a round's unreachable
// agents time out together, not one after another (a bounded pool would
// make a rollback's fan-out wait for them in series).
//
// Why keep them: a new goroutine's stack grows, copied each
// time, through the gRPC call, protobuf and fmt; a kept one has grown
// already. At 10,000 simulated agents that growth was 7.6 % of the
// operation's CPU, both ends together, in the fan-outs alone (docs/
// benchmarks.md).
type workers struct {
	idle time.Duration
	work chan func() // unbuffered: a send succeeds only to an idle worker
	// started counts the goroutines started, live those not yet ended.
	started, live atomic.Int64
}

func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		w.live.Add(1)
		go w.loop(f)
	}
}

func (w *workers) loop(f func()) {
	defer w.live.Add(-1)
	t := time.NewTimer(w.idle)
	defer t.Stop()
	for {
		f()
		f = nil // an idle worker holds nothing of the call it ran
		t.Reset(w.idle)
		select {
		case f = <-w.work:
		case <-t.C:
			return
		}
	}
}

// warmParallel is how many agent connections WarmAgents opens at once: a
// handshake costs CPU on both ends, and thousands at once on a small
// coordinator overran the 5 s connect deadline (MinConnectTimeout above) in
// the scale benchmark, each failure starting its handshake again.
const warmParallel = 64

// waitReady connects cc and waits until it is ready (true), fails, or
// within has passed.
func waitReady(ctx context.Context, cc *grpc.ClientConn, within time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	cc.Connect()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			return false
		}
		if !cc.WaitForStateChange(ctx, s) {
			return false
		}
	}
}
