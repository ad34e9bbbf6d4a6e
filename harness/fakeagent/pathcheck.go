package fakeagent

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/pathprobe"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Underlay is the network the fake agents' path checks cross: Drop says
// whether a frame from → to with vni and outer size is dropped. Agents
// share one (SetUnderlay); nil drops nothing.
type Underlay struct {
	mu   sync.Mutex
	Drop func(from, to string, vni, size uint32) bool
	// DropControl drops the control frames from → to on the current
	// port; nil drops none.
	DropControl func(from, to string) bool
	// DropControlFrame drops the control frames from → to of vni and
	// size (an MTU the current port has too, say); nil drops none.
	DropControlFrame func(from, to string, vni, size uint32) bool
	// HostDrop is to's own firewall dropping the frames from → to on the
	// port under test: they arrive on to's interfaces (its capture sees
	// them) and reach no socket; nil drops none.
	HostDrop func(from, to string) bool
}

func (u *Underlay) drops(from, to string, vni, size uint32) bool {
	if u == nil {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.Drop != nil && u.Drop(from, to, vni, size)
}

// SetDrop replaces the drop rule.
func (u *Underlay) SetDrop(f func(from, to string, vni, size uint32) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.Drop = f
}

// SetDropControl replaces the control drop rule.
func (u *Underlay) SetDropControl(f func(from, to string) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.DropControl = f
}

func (u *Underlay) dropsControl(from, to string, vni, size uint32) bool {
	if u == nil {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return (u.DropControl != nil && u.DropControl(from, to)) || (u.DropControlFrame != nil && u.DropControlFrame(from, to, vni, size))
}

func (u *Underlay) hostDrops(from, to string) bool {
	if u == nil {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.HostDrop != nil && u.HostDrop(from, to)
}

// SetDropControlFrame replaces the per-frame control drop rule.
func (u *Underlay) SetDropControlFrame(f func(from, to string, vni, size uint32) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.DropControlFrame = f
}

// SetHostDrop replaces the receiving node's own firewall rule.
func (u *Underlay) SetHostDrop(f func(from, to string) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.HostDrop = f
}

// pathExchange is how long after the start a simulated check has every
// frame: a round trip and the agents' start skew on a real network (the
// 8-node lab's agents, 2 cores shared by all, took 41-50 ms before their
// linger: docs/benchmarks.md, "Underlay path check").
const pathExchange = 2 * time.Millisecond

// passesAll reports whether every frame of req passes both ways between
// node and each peer: the real agent's early end (control frames are not
// waited for).
func (u *Underlay) passesAll(node string, req *agentv1.PathCheckRequest) bool {
	for _, p := range req.Peers {
		for _, v := range req.Vnis {
			for _, z := range req.Sizes {
				if u.drops(node, p.Name, v, z) || u.drops(p.Name, node, v, z) || u.hostDrops(node, p.Name) || u.hostDrops(p.Name, node) {
					return false
				}
			}
		}
	}
	return len(req.ListenFor) == 0 // the coordinator sends none: modelled as the whole window
}

// SetUnderlay makes the agent's path checks cross u.
func (a *Agent) SetUnderlay(u *Underlay) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.underlay = u
}

// SetPathTiming makes PathCheck take as long as the real agent's: until
// the request's start instant plus its window. Off, it answers at once
// (the unit tests' default: a window per cutover would slow them all).
func (a *Agent) SetPathTiming(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pathTimed = on
}

// defaultUnderlayAddr is a node's underlay address as Info reports it.
func defaultUnderlayAddr(node string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	v := h.Sum32()
	return fmt.Sprintf("198.18.%d.%d", (v>>8)%256, 1+v%254)
}

// PathCheck implements AgentService: every request is judged by the
// shared Underlay at once (no window), both directions. A port in
// busyPorts is refused as the real agent refuses it.
func (a *Agent) PathCheck(ctx context.Context, req *agentv1.PathCheckRequest) (*agentv1.PathCheckResponse, error) {
	if err, _ := a.faultRO(ctx, "PathCheck"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	timed, u := a.pathTimed, a.underlay
	a.mu.Unlock()
	if timed {
		// As the real agent (pkg/pathprobe): the window opens at the
		// start instant (its own clock); the answer comes when it closes,
		// or, when every frame passed both ways, about a round trip after
		// the start and 1.5 resend intervals on (its linger).
		start := time.Unix(0, req.StartUnixNano)
		if req.StartUnixNano == 0 {
			start = a.now()
		}
		end := start.Add(time.Duration(req.WindowMillis) * time.Millisecond)
		if u.passesAll(a.node, req) {
			iv := time.Duration(req.IntervalMillis) * time.Millisecond
			end = start.Add(pathExchange + iv + iv/2)
		}
		select {
		case <-time.After(end.Sub(a.now())):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if who, ok := a.busyPorts[req.Port]; ok || req.Port == a.port {
		if !ok {
			who = "the overlay"
		}
		return nil, status.Errorf(codes.FailedPrecondition, "node %s: udp port %d on %s is not free: address already in use (held by %s)", a.node, req.Port, defaultUnderlayAddr(a.node), who)
	}
	resp := &agentv1.PathCheckResponse{Node: a.node, Address: fmt.Sprintf("%s:%d", defaultUnderlayAddr(a.node), req.Port)}
	var sizes []int
	for _, z := range req.Sizes {
		sizes = append(sizes, int(z))
	}
	for _, p := range req.Peers {
		for _, v := range req.Vnis {
			for _, z := range req.Sizes {
				// As the real agent: a frame arrives (its capture sees it,
				// wire) when the underlay passes it; it reaches the
				// socket unless the receiver's own firewall drops it.
				thereWire := !a.underlay.drops(a.node, p.Name, v, z)
				backWire := !a.underlay.drops(p.Name, a.node, v, z)
				there := thereWire && !a.underlay.hostDrops(a.node, p.Name)
				back := backWire && !a.underlay.hostDrops(p.Name, a.node)
				resp.Results = append(resp.Results, &agentv1.PathProbeResult{Peer: p.Name, Vni: v, Size: z, Sent: 1,
					Answered: there && back, Received: back, Wire: backWire})
			}
		}
		if req.ControlPort != 0 {
			for _, f := range pathprobe.ControlFrames(req.Vnis, sizes, req.ControlVni) {
				resp.Results = append(resp.Results, &agentv1.PathProbeResult{Peer: p.Name, Vni: f.VNI, Size: uint32(f.Size), Sent: 1,
					Control: true, Received: !a.underlay.dropsControl(p.Name, a.node, f.VNI, uint32(f.Size))})
			}
		}
	}
	return resp, nil
}
