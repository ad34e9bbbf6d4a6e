// Package fakeagent is an in-memory AgentService test double for the
// coordinator's tests and benchmarks: one node's operation state and port,
// with injectable failures and delays, that records every call and dumps
// its state as canonical text.
//
// It models the agent contract (agent.proto) only as far as the
// coordinator relies on it: idempotent calls per operation id, one
// operation at a time, Commit applied at the requested instant of its own
// (optionally skewed) clock. It has no dead-man timer and no dataplane; the
// real agent (package agent, fake dataplane) is tested against the
// coordinator separately.
//
// This package must not be imported by non-test code paths of the
// coordinator binary.
package fakeagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	callstreamv1 "github.com/cutover-dev/cutover/proto/callstream/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Fault makes one method misbehave.
type Fault struct {
	Err   error         // returned instead of acting (nothing changes)
	Delay time.Duration // slept before acting (use to provoke timeouts)
	After bool          // act first, then fail with Err (a call that "timed out" after taking effect)
}

// Agent is one fake agent. The zero value is not usable; use New.
type Agent struct {
	agentv1.UnimplementedAgentServiceServer

	mu              sync.Mutex
	node            string
	port            uint32
	ready           bool
	notReady        []string
	busyPorts       map[uint32]string
	labels          map[string]string
	skew            time.Duration // agent clock − real clock
	appliedShift    time.Duration // added to the applied time a commit reports
	op              *agentv1.OperationStatus
	calls           []string
	faults          map[string]Fault
	readCalls       map[string]int
	probeRst        int
	fight           bool // after a commit, the next Info finds the old port back
	fightArmed      bool
	peers           []*agentv1.PeerProbeStats
	stall           time.Duration // the mesh's max_stall_micros
	probeReads      int
	oldInfo         bool // Info ignores probe_stats (SetOldInfo)
	oldPrep         bool // Prepare ignores reset_probe_stats (SetOldPrepare)
	probeCalls      int
	probeResetCalls int // ProbeStats calls with reset
	// The probe mesh (probe.go): the address Info reports (empty: off,
	// for probeOff), the peers the last Prepare handed over and since when
	// (agent clock), and the peers that go dark at the commit or never
	// answered.
	probeAddr  string
	probeOff   string
	probePeers []*agentv1.ProbePeer
	probeSince map[string]int64
	dark       map[string]bool
	never      map[string]bool
	underlay   *Underlay // the path check's (pathcheck.go)
	pathTimed  bool      // PathCheck waits out its window (SetPathTiming)
	unary      bool      // no call stream: an agent older than it (SetUnaryOnly)
	// Strategy auto's inputs (SetStagedAdvice, SetStagedRefusal,
	// SetOldPreflight).
	stagedLoses  bool
	stagedNote   string
	stagedRefuse string
	oldPreflight bool
}

// New returns a ready agent for node on port.
func New(node string, port uint32) *Agent {
	return &Agent{node: node, port: port, ready: true, busyPorts: map[uint32]string{}, faults: map[string]Fault{}, readCalls: map[string]int{},
		probeAddr: defaultProbeAddr(node), probeSince: map[string]int64{}, dark: map[string]bool{}, never: map[string]bool{}}
}

// SetUnaryOnly makes the agent one without the call stream (older than
// it): registered by Register, it answers the stream UNIMPLEMENTED and the
// coordinator must call it unary.
func (a *Agent) SetUnaryOnly(on bool) { a.mu.Lock(); a.unary = on; a.mu.Unlock() }

// UnaryOnly reports SetUnaryOnly.
func (a *Agent) UnaryOnly() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.unary }

// Register registers svc (a fake agent, a test's wrapper of one, or the
// real agent's service) on s with the call stream, as the agent binary
// does (pkg/callstream): the stream's calls reach svc's methods, the
// wrapper's included. A service whose UnaryOnly says so answers the
// stream UNIMPLEMENTED.
func Register(s *grpc.Server, svc agentv1.AgentServiceServer) {
	agentv1.RegisterAgentServiceServer(s, streamed{svc, callstream.NewServer(&agentv1.AgentService_ServiceDesc, svc, nil)})
}

type streamed struct {
	agentv1.AgentServiceServer
	calls *callstream.Server
}

func (s streamed) Calls(st grpc.BidiStreamingServer[callstreamv1.Frame, callstreamv1.Frame]) error {
	if u, ok := s.AgentServiceServer.(interface{ UnaryOnly() bool }); ok && u.UnaryOnly() {
		return status.Error(codes.Unimplemented, "method Calls not implemented")
	}
	return s.calls.Serve(st)
}

// SetFault makes method (e.g. "Prepare") misbehave; a zero Fault clears it.
func (a *Agent) SetFault(method string, f Fault) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f == (Fault{}) {
		delete(a.faults, method)
		return
	}
	a.faults[method] = f
}

// SetSkew offsets the agent's clock from the real one.
func (a *Agent) SetSkew(d time.Duration) { a.mu.Lock(); a.skew = d; a.mu.Unlock() }

// SetReady marks the agent ready or not (with what is not ready).
func (a *Agent) SetReady(ready bool, notReady ...string) {
	a.mu.Lock()
	a.ready, a.notReady = ready, notReady
	a.mu.Unlock()
}

// SetPort changes the port the dataplane reports (drift).
func (a *Agent) SetPort(p uint32) { a.mu.Lock(); a.port = p; a.mu.Unlock() }

// HoldPort marks a port as held by a local socket of holder.
func (a *Agent) HoldPort(p uint32, holder string) {
	a.mu.Lock()
	a.busyPorts[p] = holder
	a.mu.Unlock()
}

// SetLabels sets the labels Info reports.
func (a *Agent) SetLabels(l map[string]string) { a.mu.Lock(); a.labels = l; a.mu.Unlock() }

// ProbeReads counts ProbeStats calls that read without a reset.
func (a *Agent) ProbeReads() int { a.mu.Lock(); defer a.mu.Unlock(); return a.probeReads }

// SetPeers sets the probe stats ProbeStats reports.
func (a *Agent) SetPeers(p []*agentv1.PeerProbeStats) { a.mu.Lock(); a.peers = p; a.mu.Unlock() }

// SetStall sets how far the agent says it fell behind its probe mesh.
func (a *Agent) SetStall(d time.Duration) { a.mu.Lock(); a.stall = d; a.mu.Unlock() }

// SetFightBack makes the node's dataplane put the old port back right after
// a commit (a CNI reconciler fighting the change): the commit reads back
// fine, the next Info sees the old port.
func (a *Agent) SetFightBack(on bool) { a.mu.Lock(); a.fight = on; a.mu.Unlock() }

// ReadCalls is how many times method, one that changes nothing
// (Preflight, PathCheck, ...), was called, faulted calls included.
func (a *Agent) ReadCalls(method string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.readCalls[method]
}

// CallLog returns the mutating calls received, in order ("Prepare op1").
func (a *Agent) CallLog() []string { a.mu.Lock(); defer a.mu.Unlock(); return slices.Clone(a.calls) }

// Called reports whether method was ever called.
func (a *Agent) Called(method string) bool {
	for _, c := range a.CallLog() {
		if strings.HasPrefix(c, method+" ") || c == method {
			return true
		}
	}
	return false
}

// Port is the port the dataplane is on now.
func (a *Agent) Port() uint32 { a.mu.Lock(); defer a.mu.Unlock(); return a.port }

// Dump is the canonical state: "n1 port=4889 op=op1 phase=FINALIZED".
func (a *Agent) Dump() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := fmt.Sprintf("%s port=%d", a.node, a.port)
	if a.op != nil {
		s += fmt.Sprintf(" op=%s phase=%s", a.op.OperationId, strings.TrimPrefix(a.op.Phase.String(), "PHASE_"))
	}
	return s
}

func (a *Agent) now() time.Time { return time.Now().Add(a.skew) }

// fault applies the configured fault for method and records the call. It
// returns the error to return before acting (nil: act) and a function to
// call after acting: for an After fault it waits out the delay (or the
// caller's deadline) and returns the fault's error, modelling a call that
// took effect but whose answer was lost or late.
func (a *Agent) fault(ctx context.Context, method, opID string) (after func() error, before error) {
	a.mu.Lock()
	a.calls = append(a.calls, strings.TrimSpace(method+" "+opID))
	f := a.faults[method]
	a.mu.Unlock()
	wait := func() error {
		if f.Delay > 0 {
			select {
			case <-time.After(f.Delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	if f.After {
		return func() error {
			if err := wait(); err != nil {
				return err
			}
			return f.Err
		}, nil
	}
	if err := wait(); err != nil {
		return nil, err
	}
	return nil, f.Err
}

func (a *Agent) statusLocked() *agentv1.OperationStatus {
	if a.op == nil {
		return &agentv1.OperationStatus{Phase: agentv1.Phase_PHASE_IDLE, CurrentPort: a.port}
	}
	s := proto.Clone(a.op).(*agentv1.OperationStatus)
	s.CurrentPort = a.port
	return s
}

// checkOp refuses a call for another operation while one is in flight.
func (a *Agent) checkOp(id string) error {
	if a.op != nil && a.op.OperationId != id {
		switch a.op.Phase {
		case agentv1.Phase_PHASE_PREPARED, agentv1.Phase_PHASE_COMMITTED:
			return status.Errorf(codes.FailedPrecondition, "operation %s is in flight", a.op.OperationId)
		}
	}
	return nil
}

// Info implements AgentService.
func (a *Agent) Info(ctx context.Context, req *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	if err, _ := a.faultRO(ctx, "Info"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fightArmed && a.op != nil {
		a.port, a.fightArmed = a.op.FromPort, false
	}
	resp := &agentv1.InfoResponse{Node: a.node, Version: "fake", Backend: "fake", Device: "vxlan0", CurrentPort: a.port,
		Ready: a.ready, NotReady: a.notReady, Operation: a.statusLocked(), Labels: a.labels,
		ProbeAddress: a.probeAddr, ProbeOffReason: a.probeOffLocked(),
		UnderlayAddress: defaultUnderlayAddr(a.node), OverlayVnis: []uint32{0}, OverlayMtu: 1450}
	if req.GetProbeStats() && !a.oldInfo {
		resp.ProbeStats = a.probeStatsLocked(false)
	}
	return resp, nil
}

// SetOldPrepare makes Prepare ignore reset_probe_stats, as an agent older
// than that field does.
func (a *Agent) SetOldPrepare(on bool) { a.mu.Lock(); a.oldPrep = on; a.mu.Unlock() }

// SetStagedAdvice sets what Preflight says of the staged strategy against
// the atomic one (staged_loses_less, strategy_note), as a real agent's
// backend does for its configuration.
func (a *Agent) SetStagedAdvice(loses bool, note string) {
	a.mu.Lock()
	a.stagedLoses, a.stagedNote = loses, note
	a.mu.Unlock()
}

// SetStagedRefusal makes a staged Preflight report problem (a problem of
// the staged strategy alone; empty: none).
func (a *Agent) SetStagedRefusal(problem string) {
	a.mu.Lock()
	a.stagedRefuse = problem
	a.mu.Unlock()
}

// SetOldPreflight makes a staged Preflight answer without the atomic
// judgement (PreflightResponse.atomic), as an agent older than that field
// does.
func (a *Agent) SetOldPreflight(on bool) { a.mu.Lock(); a.oldPreflight = on; a.mu.Unlock() }

// SetOldInfo makes Info ignore probe_stats, as an agent older than that
// field does.
func (a *Agent) SetOldInfo(on bool) { a.mu.Lock(); a.oldInfo = on; a.mu.Unlock() }

// faultRO is fault without recording the call (read-only methods).
func (a *Agent) faultRO(ctx context.Context, method string) (error, error) {
	a.mu.Lock()
	a.readCalls[method]++
	f := a.faults[method]
	a.mu.Unlock()
	if f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-ctx.Done():
			return ctx.Err(), nil
		}
	}
	return f.Err, nil
}

// Clock implements AgentService.
func (a *Agent) Clock(context.Context, *agentv1.ClockRequest) (*agentv1.ClockResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &agentv1.ClockResponse{UnixNano: a.now().UnixNano()}, nil
}

// Preflight implements AgentService.
func (a *Agent) Preflight(ctx context.Context, r *agentv1.PreflightRequest) (*agentv1.PreflightResponse, error) {
	if err, _ := a.faultRO(ctx, "Preflight"); err != nil {
		return nil, err
	}
	// As the real agent: Info rides along (and a fault set on Info fails
	// the preflight as it failed the separate call).
	info, err := a.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	holder, busy := a.busyPorts[r.TargetPort]
	resp := &agentv1.PreflightResponse{Info: info, CurrentPort: a.port, TargetPortFree: !busy, TargetPortUser: holder,
		Actions:         []string{fmt.Sprintf("open udp/%d", r.TargetPort), fmt.Sprintf("set vxlan0 dst_port %d→%d", a.port, r.TargetPort)},
		StagedLosesLess: a.stagedLoses, StrategyNote: a.stagedNote}
	if busy {
		resp.Problems = append(resp.Problems, fmt.Sprintf("udp/%d is held by %s", r.TargetPort, holder))
	}
	if r.Strategy != "staged" {
		return resp, nil
	}
	// As the real agent: staged's problems and actions, the atomic
	// ones beside them.
	if !a.oldPreflight {
		resp.Atomic = &agentv1.AtomicCheck{Problems: slices.Clone(resp.Problems), Actions: resp.Actions}
	}
	resp.Actions = []string{fmt.Sprintf("receive udp/%d beside %d", r.TargetPort, a.port), fmt.Sprintf("send udp/%d", r.TargetPort), fmt.Sprintf("retire udp/%d", a.port)}
	if a.stagedRefuse != "" {
		resp.Problems = append(resp.Problems, a.stagedRefuse)
	}
	return resp, nil
}

// Prepare implements AgentService.
func (a *Agent) Prepare(ctx context.Context, r *agentv1.PrepareRequest) (*agentv1.PrepareResponse, error) {
	after, before := a.fault(ctx, "Prepare", r.OperationId)
	if before != nil {
		return nil, before
	}
	a.mu.Lock()
	if err := a.checkOp(r.OperationId); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if a.op == nil || a.op.OperationId != r.OperationId {
		if a.port != r.FromPort {
			a.mu.Unlock()
			return nil, status.Errorf(codes.FailedPrecondition, "current port is %d, not from_port %d", a.port, r.FromPort)
		}
		a.op = &agentv1.OperationStatus{OperationId: r.OperationId, Phase: agentv1.Phase_PHASE_PREPARED, FromPort: r.FromPort, ToPort: r.ToPort}
		a.setProbePeersLocked(r.ProbePeers)
	}
	resp := &agentv1.PrepareResponse{Status: a.statusLocked()}
	if r.ResetProbeStats && !a.oldPrep {
		a.probeStatsLocked(true)
		resp.ProbeStatsReset = true
	}
	a.mu.Unlock()
	if after != nil {
		if err := after(); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// SetAppliedShift makes the agent report its commits applied d later than
// it applied them: an agent that woke late for the instant.
func (a *Agent) SetAppliedShift(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.appliedShift = d
}

// Commit implements AgentService.
func (a *Agent) Commit(ctx context.Context, r *agentv1.CommitRequest) (*agentv1.CommitResponse, error) {
	after, before := a.fault(ctx, "Commit", r.OperationId)
	if before != nil {
		return nil, before
	}
	received := a.now().UnixNano()
	a.mu.Lock()
	if a.op == nil || a.op.OperationId != r.OperationId {
		a.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "operation %s is not prepared here", r.OperationId)
	}
	if a.op.Phase == agentv1.Phase_PHASE_PREPARED {
		wait := time.Until(time.Unix(0, r.AtUnixNano).Add(-a.skew))
		a.mu.Unlock()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		a.mu.Lock()
		if a.op.Phase == agentv1.Phase_PHASE_PREPARED {
			a.op.AppliedUnixNano = a.now().Add(a.appliedShift).UnixNano()
			a.port = a.op.ToPort
			a.op.Phase = agentv1.Phase_PHASE_COMMITTED
			a.op.DeadlineUnixNano = a.op.AppliedUnixNano + r.DeadmanMillis*int64(time.Millisecond)
			a.fightArmed = a.fight
		}
	}
	if a.op.Phase != agentv1.Phase_PHASE_COMMITTED && a.op.Phase != agentv1.Phase_PHASE_CONFIRMED && a.op.Phase != agentv1.Phase_PHASE_FINALIZED {
		p := a.op.Phase
		a.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "operation %s is %s", r.OperationId, p)
	}
	st := a.statusLocked()
	a.mu.Unlock()
	if after != nil {
		if err := after(); err != nil {
			return nil, err
		}
	}
	return &agentv1.CommitResponse{Status: st, AppliedUnixNano: st.AppliedUnixNano, ApplyNanos: 1000, ReadbackPort: st.CurrentPort, ReceivedUnixNano: received}, nil
}

func (a *Agent) transition(ctx context.Context, method, id string, allowed []agentv1.Phase, to agentv1.Phase, apply func()) (*agentv1.OperationStatus, error) {
	after, before := a.fault(ctx, method, id)
	if before != nil {
		return nil, before
	}
	a.mu.Lock()
	if a.op == nil || a.op.OperationId != id {
		a.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "operation %s unknown here", id)
	}
	if a.op.Phase != to {
		if !slices.Contains(allowed, a.op.Phase) {
			p := a.op.Phase
			a.mu.Unlock()
			return nil, status.Errorf(codes.FailedPrecondition, "%s: operation %s is %s", method, id, p)
		}
		if apply != nil {
			apply()
		}
		a.op.Phase = to
	}
	st := a.statusLocked()
	a.mu.Unlock()
	if after != nil {
		if err := after(); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Confirm implements AgentService.
func (a *Agent) Confirm(ctx context.Context, r *agentv1.ConfirmRequest) (*agentv1.OperationStatus, error) {
	return a.transition(ctx, "Confirm", r.OperationId, []agentv1.Phase{agentv1.Phase_PHASE_COMMITTED}, agentv1.Phase_PHASE_CONFIRMED, nil)
}

// Finalize implements AgentService.
func (a *Agent) Finalize(ctx context.Context, r *agentv1.FinalizeRequest) (*agentv1.OperationStatus, error) {
	return a.transition(ctx, "Finalize", r.OperationId, []agentv1.Phase{agentv1.Phase_PHASE_CONFIRMED}, agentv1.Phase_PHASE_FINALIZED, nil)
}

// Rollback implements AgentService: an unknown operation has nothing to
// undo and answers IDLE.
func (a *Agent) Rollback(ctx context.Context, r *agentv1.RollbackRequest) (*agentv1.OperationStatus, error) {
	after, before := a.fault(ctx, "Rollback", r.OperationId)
	if before != nil {
		return nil, before
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.op == nil || a.op.OperationId != r.OperationId {
		return &agentv1.OperationStatus{OperationId: r.OperationId, Phase: agentv1.Phase_PHASE_IDLE, CurrentPort: a.port}, nil
	}
	switch a.op.Phase {
	case agentv1.Phase_PHASE_PREPARED:
		a.op.Phase = agentv1.Phase_PHASE_ABORTED
	case agentv1.Phase_PHASE_COMMITTED, agentv1.Phase_PHASE_CONFIRMED, agentv1.Phase_PHASE_FINALIZED:
		a.port = a.op.FromPort
		a.op.Phase = agentv1.Phase_PHASE_REVERTED
		a.op.RevertedBy = "rollback"
	}
	st := a.statusLocked()
	if after != nil {
		a.mu.Unlock()
		err := after()
		a.mu.Lock()
		if err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Status implements AgentService.
func (a *Agent) Status(ctx context.Context, r *agentv1.StatusRequest) (*agentv1.OperationStatus, error) {
	if err, _ := a.faultRO(ctx, "Status"); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.OperationId != "" && (a.op == nil || a.op.OperationId != r.OperationId) {
		return nil, status.Errorf(codes.NotFound, "operation %s unknown here", r.OperationId)
	}
	return a.statusLocked(), nil
}
