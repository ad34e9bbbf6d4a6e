package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/callstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Fleet is the coordinator's side of its agents: the inventory as last
// read, a client per agent (every node ever in the inventory keeps its
// client until Close), and the clock sampling that bounds how many agents
// are sampled at once.
type Fleet struct {
	invMu     sync.RWMutex
	inv       model.Inventory       // read through Inventory()
	agents    map[string]*Agent     // read through Agent(n); every node ever in inv
	gone      map[string]*Agent     // Agent(n) of nodes outside inv (goneAgent)
	retired   []*Agent              // replaced clients, closed by Close
	refreshMu sync.Mutex            // one Refresh at a time
	source    model.InventorySource // nil: a fixed inventory
	dial      []grpc.DialOption
	callOpts  callstream.Options // the agents' call streams'
	clock     Clock
	log       *slog.Logger
	// clockSlots bounds how many agents are clock-sampled at once
	// (Clock.Parallel, MeasureClock).
	clockSlots chan struct{}
	clockFloor atomic.Int64 // the shortest clock round trip seen to any agent, ns (goodRTT)
}

// Clock is how agents' clocks are sampled (the coordinator's
// --clock-samples, --clock-good-rtt and --clock-parallel).
type Clock struct {
	Samples  int
	GoodRTT  time.Duration
	Parallel int
}

// New dials (lazily) every agent of inv. source, when not nil, is read
// again by Refresh.
func New(inv model.Inventory, source model.InventorySource, dialOpts []grpc.DialOption, callOpts callstream.Options, clock Clock, log *slog.Logger) (*Fleet, error) {
	agents, err := dial(inv, dialOpts, callOpts)
	if err != nil {
		return nil, err
	}
	return &Fleet{inv: inv, agents: agents, gone: map[string]*Agent{}, source: source, dial: dialOpts, callOpts: callOpts,
		clock: clock, log: log, clockSlots: make(chan struct{}, clock.Parallel)}, nil
}

// Close closes every client the fleet handed out.
func (f *Fleet) Close() {
	f.invMu.Lock()
	defer f.invMu.Unlock()
	for _, a := range f.agents {
		_ = a.Conn.Close()
	}
	for _, a := range f.retired {
		_ = a.Conn.Close()
	}
	for _, a := range f.gone {
		_ = a.Conn.Close()
	}
}

// Inventory is the current inventory.
func (f *Fleet) Inventory() model.Inventory {
	f.invMu.RLock()
	defer f.invMu.RUnlock()
	return f.inv
}

// Agent is node n's client: every node ever in the inventory keeps its
// client until Close, so a request validated against an older inventory,
// or a running operation, never finds its node gone (preflight's cluster
// checks say that the node left). A node an operation names that the
// inventory never had in this process (it left the cluster, and the
// coordinator restarted since) gets a client whose every call fails
// UNAVAILABLE saying so: the operation counts it unreached, as it would a
// node that is down, instead of the coordinator failing.
func (f *Fleet) Agent(n string) *Agent {
	if a := f.Known(n); a != nil {
		return a
	}
	f.invMu.Lock()
	defer f.invMu.Unlock()
	if a := f.agents[n]; a != nil {
		return a
	}
	if g := f.gone[n]; g != nil {
		return g
	}
	g := goneAgent(n)
	f.gone[n] = g
	return g
}

// Known is node n's agent client, nil when the inventory never had n.
func (f *Fleet) Known(n string) *Agent {
	f.invMu.RLock()
	defer f.invMu.RUnlock()
	return f.agents[n]
}

// goneAgent is the client Agent hands out for a node outside the
// inventory: a connection that never dials.
func goneAgent(n string) *Agent {
	why := fmt.Errorf("node %s is not in the inventory: its agent cannot be reached", n)
	conn, err := grpc.NewClient("passthrough:///"+n, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return nil, why }))
	if err != nil { // a constant target: cannot happen
		panic(err)
	}
	return &Agent{Spec: model.AgentSpec{Node: n, Address: "(not in the inventory)"}, Conn: conn, Client: agentv1.NewAgentServiceClient(conn)}
}

// Refresh reads the inventory source, when there is one, and
// dials the agents that are new or moved. A failed read keeps the last
// inventory and is returned for the caller to report.
func (f *Fleet) Refresh(ctx context.Context) error {
	if f.source == nil {
		return nil
	}
	f.refreshMu.Lock() // one refresh at a time: no two dials of one agent
	defer f.refreshMu.Unlock()
	inv, err := f.source(ctx)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	var fresh model.Inventory
	for _, a := range inv.Agents {
		if old := f.Known(a.Node); old == nil || old.Spec.Address != a.Address {
			fresh.Agents = append(fresh.Agents, a)
		}
	}
	dialed, err := dial(fresh, f.dial, f.callOpts)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	f.invMu.Lock()
	defer f.invMu.Unlock()
	for n, ac := range dialed {
		if old := f.agents[n]; old != nil {
			f.retired = append(f.retired, old) // a running call may still use it
		}
		f.agents[n] = ac
	}
	for _, a := range inv.Agents {
		if old := f.agents[a.Node]; !equalSpec(old.Spec, a) { // labels or overlay changed
			moved := *old // the same connection and call stream
			moved.Spec = a
			f.agents[a.Node] = &moved
		}
	}
	if added := len(dialed); added > 0 || len(inv.Agents) != len(f.inv.Agents) {
		f.log.Info("inventory changed", "agents", len(inv.Agents), "new_or_moved", added)
	}
	f.inv = inv
	return nil
}

func equalSpec(a, b model.AgentSpec) bool {
	return a.Node == b.Node && a.Address == b.Address && a.Overlay == b.Overlay && maps.Equal(a.Labels, b.Labels)
}

// MeasureClock takes up to ClockSamples Clock samples of one agent and
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
func (f *Fleet) MeasureClock(ctx context.Context, cl agentv1.AgentServiceClient) (ClockSample, error) {
	select {
	case f.clockSlots <- struct{}{}:
		defer func() { <-f.clockSlots }()
	case <-ctx.Done():
		return ClockSample{}, fmt.Errorf("clock: no sample: waiting for a sampling slot: %w", ctx.Err())
	}
	best := ClockSample{RTT: -1}
	var lastErr error
	for i := range f.clock.Samples {
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
		if best.RTT < 0 || rtt < best.RTT {
			mid := t0.UnixNano() + rtt.Nanoseconds()/2
			best = ClockSample{Offset: time.Duration(r.UnixNano - mid), RTT: rtt}
		}
		if f.goodRTT(rtt, i) {
			break
		}
	}
	if best.RTT < 0 {
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
func (f *Fleet) goodRTT(rtt time.Duration, i int) bool {
	prev := time.Duration(f.clockFloor.Load())
	for floor := prev; (floor == 0 || rtt < floor) && !f.clockFloor.CompareAndSwap(int64(floor), int64(rtt)); {
		floor = time.Duration(f.clockFloor.Load())
	}
	if f.clock.GoodRTT == 0 {
		return false
	}
	return rtt <= f.clock.GoodRTT || (i > 0 && prev > 0 && rtt <= prev+prev/4)
}

// Warm opens every agent's connection in the background, at most
// warmParallel at a time, so that the first operation after the
// coordinator starts (or takes over the lead) finds them open, as every
// later one does (AgentIdleTimeout). Without it that operation dials and
// handshakes every agent inside its preflight: at 10,000 simulated agents
// with mTLS, handshakes timed out and the preflight refused the cutover
// (docs/benchmarks.md). An agent not reached is left to the preflight,
// which names it; ctx ending stops the warming. The goroutine counts
// in wg, so that the caller can wait for it before closing the fleet.
func (f *Fleet) Warm(ctx context.Context, wg *sync.WaitGroup) {
	f.invMu.Lock()
	conns := make([]*Agent, 0, len(f.agents))
	for _, a := range f.agents {
		conns = append(conns, a)
	}
	f.invMu.Unlock()
	wg.Go(func() {
		start := time.Now()
		var ready atomic.Int64
		slots := make(chan struct{}, warmParallel)
		var calls sync.WaitGroup
		for _, a := range conns {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			calls.Go(func() {
				ok := waitReady(ctx, a.Conn, 10*time.Second)
				<-slots // the slots bound handshakes, not the streams' round trip
				if !ok {
					return
				}
				// And its call stream, so that the first call does not
				// wait for the stream's round trip.
				octx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if a.Calls.Open(octx) == nil {
					ready.Add(1)
				}
			})
		}
		calls.Wait()
		f.log.Info("agent connections opened ahead of the first operation", "ready", ready.Load(), "agents", len(conns), "took", time.Since(start).Round(time.Millisecond))
	})
}
