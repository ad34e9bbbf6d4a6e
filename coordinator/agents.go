package coordinator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// agentConn is the client side of one agent.
type agentConn struct {
	spec   AgentSpec
	conn   *grpc.ClientConn
	calls  *callstream.Conn // client's calls: one stream on conn
	client agentv1.AgentServiceClient
}

// dialAgents opens a lazy client to every agent. grpc.NewClient does not
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
func dialAgents(inv Inventory, opts []grpc.DialOption, callOpts callstream.Options) (map[string]*agentConn, error) {
	opts = append(append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	})}, callstream.DialOptions()...), opts...)
	out := map[string]*agentConn{}
	for _, s := range inv.Agents {
		cc, err := grpc.NewClient("passthrough:///"+s.Address, opts...)
		if err != nil {
			for _, a := range out {
				_ = a.conn.Close()
			}
			return nil, fmt.Errorf("agent %s at %s: %w", s.Node, s.Address, err)
		}
		// The calls go over one stream per agent (pkg/callstream): at
		// 10,000 agents a stream per call cost more than the calls'
		// messages. An older agent is called unary.
		calls := callstream.NewConn(cc, agentv1.AgentService_Calls_FullMethodName, callOpts)
		out[s.Node] = &agentConn{spec: s, conn: cc, calls: calls, client: agentv1.NewAgentServiceClient(calls)}
	}
	return out, nil
}

// clockSample is one agent's offset estimate.
type clockSample struct {
	offset time.Duration // agent clock − coordinator clock
	rtt    time.Duration
}

// measureClock takes up to ClockSamples Clock samples of one agent and
// keeps the lowest-RTT one: offset = agent − (t0+t1)/2. The RTT bounds the
// error (the agent read its clock somewhere inside [t0, t1]), so sampling
// stops at a round trip goodRTT accepts: within ClockGoodRTT (an error of
// at most half that), or as short as the network has shown. time.Now carries a monotonic reading, so t1−t0 is immune to
// wall-clock steps; the wall clock is what agents are told, so the
// midpoint uses wall time.
//
// At most ClockParallel agents are sampled at once, across every caller.
// A sample is only as good as its round trip, and a round
// trip taken while the coordinator sends a thousand other calls measures
// the coordinator's own queue: at 1,000 simulated agents sampled all at
// once the worst agent's best round trip was 84 ms, at 10,000 332 ms;
// bounded, 1.0 ms at both (make bench-coordinator). The offsets' error
// and the commit lead (a multiple of the worst RTT) grow with it.
func (c *Coordinator) measureClock(ctx context.Context, cl agentv1.AgentServiceClient) (clockSample, error) {
	select {
	case c.clockSlots <- struct{}{}:
		defer func() { <-c.clockSlots }()
	case <-ctx.Done():
		return clockSample{}, fmt.Errorf("clock: no sample: waiting for a sampling slot: %w", ctx.Err())
	}
	best := clockSample{rtt: -1}
	var lastErr error
	for i := range c.cfg.ClockSamples {
		t0 := time.Now()
		r, err := cl.Clock(ctx, &agentv1.ClockRequest{})
		t1 := time.Now()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rtt := t1.Sub(t0)
		if best.rtt < 0 || rtt < best.rtt {
			mid := t0.UnixNano() + rtt.Nanoseconds()/2
			best = clockSample{offset: time.Duration(r.UnixNano - mid), rtt: rtt}
		}
		if c.goodRTT(rtt, i) {
			break
		}
	}
	if best.rtt < 0 {
		return best, fmt.Errorf("clock: no sample: %w", lastErr)
	}
	return best, nil
}

// goodRTT records rtt, an agent's i-th sample's round trip, and says
// whether it ends that agent's sampling: within ClockGoodRTT, or (from
// the second sample on) within a quarter above the shortest round trip
// this coordinator had seen to any agent before it. The second keeps the
// sampling to two calls where no round trip is within ClockGoodRTT (a
// network across zones): more could not do much better than the network
// allows, and 8 calls per agent at 10,000 agents and 2 ms would be 20 s
// of preflight at ClockParallel 8. ClockGoodRTT 0 turns both off.
func (c *Coordinator) goodRTT(rtt time.Duration, i int) bool {
	prev := time.Duration(c.clockFloor.Load())
	for floor := prev; (floor == 0 || rtt < floor) && !c.clockFloor.CompareAndSwap(int64(floor), int64(rtt)); {
		floor = time.Duration(c.clockFloor.Load())
	}
	if c.cfg.ClockGoodRTT == 0 {
		return false
	}
	return rtt <= c.cfg.ClockGoodRTT || (i > 0 && prev > 0 && rtt <= prev+prev/4)
}

// fanOut runs f for every node in parallel and waits, on fanWorkers.
func fanOut(nodes []string, f func(node string)) {
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

// WarmAgents opens every agent's connection in the background, at most
// warmParallel at a time, so that the first operation after the
// coordinator starts (or takes over the lead) finds them open, as every
// later one does (AgentIdleTimeout). Without it that operation dials and
// handshakes every agent inside its preflight: at 10,000 simulated agents
// with mTLS, handshakes timed out and the preflight refused the cutover
// (docs/benchmarks.md). An agent not reached is left to the preflight,
// which names it; Close stops the warming.
func (c *Coordinator) WarmAgents() {
	c.invMu.Lock()
	conns := make([]*agentConn, 0, len(c.agents))
	for _, a := range c.agents {
		conns = append(conns, a)
	}
	c.invMu.Unlock()
	c.wg.Go(func() {
		start := time.Now()
		var ready atomic.Int64
		slots := make(chan struct{}, warmParallel)
		var wg sync.WaitGroup
		for _, a := range conns {
			select {
			case slots <- struct{}{}:
			case <-c.ctx.Done():
			}
			if c.ctx.Err() != nil {
				break
			}
			wg.Go(func() {
				ok := waitReady(c.ctx, a.conn, 10*time.Second)
				<-slots // the slots bound handshakes, not the streams' round trip
				if !ok {
					return
				}
				// And its call stream, so that the first call does not
				// wait for the stream's round trip.
				octx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
				defer cancel()
				if a.calls.Open(octx) == nil {
					ready.Add(1)
				}
			})
		}
		wg.Wait()
		c.log.Info("agent connections opened ahead of the first operation", "ready", ready.Load(), "agents", len(conns), "took", time.Since(start).Round(time.Millisecond))
	})
}

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
