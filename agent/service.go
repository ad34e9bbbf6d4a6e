package agent

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/version"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// Service implements agentv1.AgentServiceServer over the operation machine
// and the backend. Until the backend is up (SetCore), Info, Clock and
// ProbeStats answer and every other call fails with UNAVAILABLE saying why.
type Service struct {
	agentv1.UnimplementedAgentServiceServer

	cfg     Config
	clock   operation.Clock
	store   operation.Store
	metrics *Metrics

	probes *overlayProbe // nil when --probe=false

	pathMu sync.Mutex // one PathCheck at a time (pathcheck.go)

	mu         sync.Mutex
	m          *operation.Machine
	be         dataplane.Backend
	backendErr error
}

// NewService returns a service with no backend yet.
func NewService(cfg Config, clock operation.Clock, store operation.Store, metrics *Metrics) *Service {
	if clock == nil {
		clock = operation.RealClock{}
	}
	return &Service{cfg: cfg, clock: clock, store: store, metrics: metrics,
		backendErr: fmt.Errorf("backend %s: not set up yet", cfg.Backend)}
}

// SetCore hands the service its machine and backend once they are up.
func (s *Service) SetCore(m *operation.Machine, be dataplane.Backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m, s.be, s.backendErr = m, be, nil
}

// SetBackendError records why the backend is not up.
func (s *Service) SetBackendError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backendErr = err
}

func (s *Service) core() (*operation.Machine, dataplane.Backend, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		return nil, nil, status.Errorf(codes.Unavailable, "agent %s is not ready: %v", s.cfg.NodeName, s.backendErr)
	}
	return s.m, s.be, nil
}

// NotReady names what is not ready (empty: ready): the backend's own
// report, the state dir, an operation that FAILED.
func (s *Service) NotReady(ctx context.Context) []string {
	m, be, err := s.core()
	if err != nil {
		s.mu.Lock()
		why := s.backendErr
		s.mu.Unlock()
		out := []string{"backend: " + why.Error()}
		if err := s.store.Check(); err != nil {
			out = append(out, "state dir: "+err.Error())
		}
		return out
	}
	var out []string
	for _, n := range be.Ready(ctx) {
		out = append(out, "backend: "+n)
	}
	return append(out, m.NotReady()...)
}

// Info implements agentv1.AgentServiceServer.
func (s *Service) Info(ctx context.Context, req *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	resp := &agentv1.InfoResponse{
		Node:    s.cfg.NodeName,
		Version: version.Version,
		Backend: s.cfg.Backend,
		Labels:  s.cfg.Labels,
	}
	notReady := s.NotReady(ctx)
	if m, be, err := s.core(); err == nil {
		resp.Backend, resp.Device = be.Name(), be.Device()
		st, err := be.Read(ctx)
		if err != nil {
			// CurrentPort stays 0: unknown. A backend's Ready usually
			// reports the same failure (a missing interface) in the same
			// words: say it once.
			if !saysAlready(notReady, err.Error()) {
				notReady = append(notReady, "dataplane read: "+err.Error())
			}
		} else {
			resp.CurrentPort = uint32(st.Port)
			s.metrics.PortObserved(st.Port)
		}
		rec, _ := m.Status("")
		resp.Operation = toStatus(rec, st.Port)
		s.pathInfo(resp, st, err == nil)
	} else {
		s.pathInfo(resp, dataplane.State{}, false)
	}
	resp.Ready = len(notReady) == 0
	resp.NotReady = notReady
	resp.ProbeAddress, resp.ProbeOffReason = s.probeStatus()
	if req.GetProbeStats() {
		resp.ProbeStats = s.probeStats(false)
	}
	return resp, nil
}

// saysAlready reports whether one of the lines is msg, after its "what: "
// prefix.
func saysAlready(lines []string, msg string) bool {
	for _, l := range lines {
		if l == msg || strings.HasSuffix(l, ": "+msg) {
			return true
		}
	}
	return false
}

// ObservePort reads the port back from the dataplane and updates
// cutover_agent_current_port. Run calls it on a timer: a change made behind
// the agent's back (another controller, a hand-run ovs-vsctl) must show in
// the metric, or the port-drift alert cannot see it.
func (s *Service) ObservePort(ctx context.Context) {
	if _, be, err := s.core(); err == nil {
		if st, err := be.Read(ctx); err == nil {
			s.metrics.PortObserved(st.Port)
		}
	}
}

// Clock implements agentv1.AgentServiceServer.
func (s *Service) Clock(context.Context, *agentv1.ClockRequest) (*agentv1.ClockResponse, error) {
	return &agentv1.ClockResponse{UnixNano: s.clock.Now().UnixNano()}, nil
}

// Preflight implements agentv1.AgentServiceServer. It changes nothing.
func (s *Service) Preflight(ctx context.Context, req *agentv1.PreflightRequest) (*agentv1.PreflightResponse, error) {
	if req.GetOperationId() != "" {
		if err := checkOpID(req.GetOperationId()); err != nil {
			return nil, err
		}
	}
	to, err := checkPort("target_port", req.GetTargetPort())
	if err != nil {
		return nil, err
	}
	m, be, err := s.core()
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return nil, err
	}
	staged, err := checkStrategy(req.GetStrategy())
	if err != nil {
		return nil, err
	}
	c, err := be.Preflight(ctx, to)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "preflight of %s %s on %s: %v", be.Name(), be.Device(), s.cfg.NodeName, err)
	}
	// Asked for staged, the answer carries the atomic judgement too:
	// strategy auto then needs one call per node for either pick.
	var atomic *agentv1.AtomicCheck
	if staged {
		atomic = &agentv1.AtomicCheck{Problems: slices.Clone(c.Problems), Actions: slices.Clone(c.Actions)}
		stagedCheck(ctx, be, &c, to)
	}
	resp := &agentv1.PreflightResponse{
		CurrentPort:    uint32(c.CurrentPort),
		TargetPortFree: c.TargetFree,
		TargetPortUser: c.TargetHolder,
		Problems:       c.Problems,
		Actions:        c.Actions,
		Info:           info,
		Atomic:         atomic,
	}
	if a, ok := be.(dataplane.StagedAdvisor); ok {
		resp.StagedLosesLess, resp.StrategyNote = a.StagedLosesLess()
	} else {
		resp.StrategyNote = fmt.Sprintf("backend %s: no measure of the staged strategy against the atomic one", be.Name())
	}
	// What stops either strategy.
	var both []string
	if rec, _ := m.Status(""); rec.Phase.InFlight() && rec.ID != req.GetOperationId() {
		both = append(both, fmt.Sprintf("operation %s in flight (%s, port %d -> %d): wait for it to end, or roll it back", rec.ID, rec.Phase, rec.FromPort, rec.ToPort))
	}
	both = append(both, m.NotReady()...)
	resp.Problems = append(resp.Problems, both...)
	if atomic != nil {
		atomic.Problems = append(atomic.Problems, both...)
	}
	return resp, nil
}

// Prepare implements agentv1.AgentServiceServer.
func (s *Service) Prepare(ctx context.Context, req *agentv1.PrepareRequest) (*agentv1.PrepareResponse, error) {
	if err := checkOpID(req.GetOperationId()); err != nil {
		return nil, err
	}
	from, err := checkPort("from_port", req.GetFromPort())
	if err != nil {
		return nil, err
	}
	to, err := checkPort("to_port", req.GetToPort())
	if err != nil {
		return nil, err
	}
	if from == to {
		return nil, status.Errorf(codes.InvalidArgument, "to_port %d: equal to from_port: nothing to change", to)
	}
	peers, err := s.checkProbePeers(req.GetProbePeers())
	if err != nil {
		return nil, err
	}
	if _, err := checkStrategy(req.GetStrategy()); err != nil {
		return nil, err
	}
	m, _, err := s.core()
	if err != nil {
		return nil, err
	}
	rec, err := m.PrepareStrategy(ctx, req.GetOperationId(), from, to, req.GetStrategy())
	if err != nil {
		return nil, grpcErr(err)
	}
	if flipAtPrepare(s.cfg.NodeName) {
		// Test-only I2 mutation (build tag cutover_faultinject): flip now,
		// before the barrier, and answer "prepared" as if nothing happened.
		if _, err := m.Commit(ctx, req.GetOperationId(), time.Time{}, s.cfg.Deadman); err != nil {
			return nil, grpcErr(err)
		}
	}
	if err := s.setProbePeers(req.GetOperationId(), peers); err != nil {
		return nil, err
	}
	resp := &agentv1.PrepareResponse{Status: toStatus(rec, rec.CurrentPort)}
	if req.GetResetProbeStats() {
		s.probeStats(true)
		resp.ProbeStatsReset = true
	}
	return resp, nil
}

// Commit implements agentv1.AgentServiceServer.
func (s *Service) Commit(ctx context.Context, req *agentv1.CommitRequest) (*agentv1.CommitResponse, error) {
	if err := checkOpID(req.GetOperationId()); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	var at time.Time
	switch n := req.GetAtUnixNano(); {
	case n < 0:
		return nil, status.Errorf(codes.InvalidArgument, "at_unix_nano %d: negative: give an instant of the agent's clock, or 0 for now", n)
	case n > 0:
		at = time.Unix(0, n)
		if at.Sub(now) > s.cfg.MaxCommitDelay {
			return nil, status.Errorf(codes.InvalidArgument,
				"at_unix_nano %d (%s): %s in the future of agent %s's clock (now %s), more than --max-commit-delay %s: check the measured clock offset",
				n, at.UTC().Format(time.RFC3339Nano), at.Sub(now).Round(time.Millisecond), s.cfg.NodeName, now.UTC().Format(time.RFC3339Nano), s.cfg.MaxCommitDelay)
		}
	}
	deadman := s.cfg.Deadman
	switch d := req.GetDeadmanMillis(); {
	case d < 0:
		return nil, status.Errorf(codes.InvalidArgument, "deadman_millis %d: negative: give how long to wait for confirm (0: the agent's --deadman %s)", d, s.cfg.Deadman)
	case d > 0:
		// Compare in milliseconds first: a huge d would overflow the
		// Duration and wrap to a tiny (or negative) dead-man.
		deadman = time.Duration(d) * time.Millisecond
		if d > s.cfg.MaxDeadman.Milliseconds() || deadman > s.cfg.MaxDeadman {
			return nil, status.Errorf(codes.InvalidArgument, "deadman_millis %d: longer than the agent's --max-deadman %s", d, s.cfg.MaxDeadman)
		}
	}
	budget := time.Duration(req.GetLateBudgetMillis()) * time.Millisecond
	if b := req.GetLateBudgetMillis(); b < 0 || b > s.cfg.MaxDeadman.Milliseconds() {
		return nil, status.Errorf(codes.InvalidArgument, "late_budget_millis %d: must be between 0 (apply however late) and the agent's --max-deadman %s", b, s.cfg.MaxDeadman)
	}
	m, _, err := s.core()
	if err != nil {
		return nil, err
	}
	var abandon time.Time
	if n := req.GetAbandonUnixNano(); n > 0 {
		abandon = time.Unix(0, n)
	}
	rec, err := m.CommitWithin(ctx, req.GetOperationId(), at, deadman, budget, abandon)
	if err != nil {
		return nil, grpcErr(err)
	}
	resp := &agentv1.CommitResponse{
		Status:       toStatus(rec, rec.CurrentPort),
		ApplyNanos:   int64(rec.ApplyDuration),
		ReadbackPort: uint32(rec.ReadbackPort),
	}
	if !rec.Applied.IsZero() {
		resp.AppliedUnixNano = rec.Applied.UnixNano()
	}
	resp.WrittenUnixNano, resp.EffectiveUnixNano = unixNano(rec.Written), unixNano(rec.Effective)
	resp.ReceivedUnixNano = now.UnixNano()
	resp.AnsweredUnixNano = s.clock.Now().UnixNano()
	return resp, nil
}

// Confirm implements agentv1.AgentServiceServer.
func (s *Service) Confirm(ctx context.Context, req *agentv1.ConfirmRequest) (*agentv1.OperationStatus, error) {
	return s.mutate(ctx, req.GetOperationId(), func(m *operation.Machine, id string) (operation.Record, error) {
		return m.Confirm(ctx, id)
	})
}

// Rollback implements agentv1.AgentServiceServer.
func (s *Service) Rollback(ctx context.Context, req *agentv1.RollbackRequest) (*agentv1.OperationStatus, error) {
	if len(req.GetReason()) > 1024 {
		return nil, status.Errorf(codes.InvalidArgument, "reason: %d bytes long, at most 1024", len(req.GetReason()))
	}
	return s.mutate(ctx, req.GetOperationId(), func(m *operation.Machine, id string) (operation.Record, error) {
		return m.RollbackScope(ctx, id, req.GetReason(), req.GetSendOnly())
	})
}

// Finalize implements agentv1.AgentServiceServer.
func (s *Service) Finalize(ctx context.Context, req *agentv1.FinalizeRequest) (*agentv1.OperationStatus, error) {
	return s.mutate(ctx, req.GetOperationId(), func(m *operation.Machine, id string) (operation.Record, error) {
		return m.Finalize(ctx, id)
	})
}

func (s *Service) mutate(_ context.Context, id string, f func(*operation.Machine, string) (operation.Record, error)) (*agentv1.OperationStatus, error) {
	if err := checkOpID(id); err != nil {
		return nil, err
	}
	m, _, err := s.core()
	if err != nil {
		return nil, err
	}
	rec, err := f(m, id)
	if err != nil {
		return nil, grpcErr(err)
	}
	return toStatus(rec, rec.CurrentPort), nil
}

// Status implements agentv1.AgentServiceServer. The current port is read
// back from the dataplane.
func (s *Service) Status(ctx context.Context, req *agentv1.StatusRequest) (*agentv1.OperationStatus, error) {
	if id := req.GetOperationId(); id != "" {
		if err := checkOpID(id); err != nil {
			return nil, err
		}
	}
	m, be, err := s.core()
	if err != nil {
		return nil, err
	}
	rec, err := m.Status(req.GetOperationId())
	if err != nil {
		return nil, grpcErr(err)
	}
	port := rec.CurrentPort
	if st, err := be.Read(ctx); err == nil {
		port = st.Port
	}
	return toStatus(rec, port), nil
}

// SetProbes attaches the overlay probe mesh whose figures ProbeStats reports
// and whose peers Prepare sets. Call it before serving.
func (s *Service) SetProbes(p *overlayProbe) { s.probes = p }

// ProbeStats implements agentv1.AgentServiceServer: the probe mesh's per-peer
// figures (no peers when probing is off).
func (s *Service) ProbeStats(_ context.Context, req *agentv1.ProbeStatsRequest) (*agentv1.ProbeStatsResponse, error) {
	resp := s.probeStats(req.GetReset_())
	if req.GetPark() && s.probes != nil && s.probes.coordPeers.Load() {
		// The coordinator holds the operation (a staged subset): no
		// probing at its rate until a Prepare gives the sample back.
		if err := s.probes.backToStatic(); err != nil {
			return nil, status.Errorf(codes.Internal, "park: %v", err)
		}
	}
	return resp, nil
}

// probeStats is the probe mesh's figures (ProbeStats, and Info when asked),
// reset after reading when reset is set.
func (s *Service) probeStats(reset bool) *agentv1.ProbeStatsResponse {
	resp := &agentv1.ProbeStatsResponse{Node: s.cfg.NodeName, NowUnixNano: s.clock.Now().UnixNano()}
	resp.Address, resp.OffReason = s.probeStatus()
	if s.probes == nil {
		return resp
	}
	mesh := s.probes.mesh
	resp.IntervalMicros = mesh.Interval().Microseconds()
	resp.TimeoutMicros = mesh.Timeout().Microseconds()
	stats, stall := mesh.Snapshot(reset)
	resp.MaxStallMicros = stall.Microseconds()
	for _, st := range stats {
		p := &agentv1.PeerProbeStats{
			Peer: st.Peer, Address: st.Address, Sent: st.Sent, Received: st.Received,
			Lost: st.Lost, LongestGapMicros: st.LongestGap.Microseconds(),
			ProbingSinceUnixNano:     unixNano(st.Since),
			LastAnswerUnixNano:       unixNano(st.LastAnswer),
			LastAnsweredSentUnixNano: unixNano(st.LastAnsweredSent),
			LongestGapFromUnixNano:   unixNano(st.LongestGapFrom),
		}
		for _, r := range st.Losses {
			p.LossRuns = append(p.LossRuns, &agentv1.LossRun{FirstSentUnixNano: r.First.UnixNano(), LastSentUnixNano: r.Last.UnixNano(), Count: r.Count})
		}
		resp.Peers = append(resp.Peers, p)
	}
	return resp
}

// toStatus maps a record to the API. PREPARING has no API phase: it is
// reported as IDLE (nothing the coordinator may commit yet).
func toStatus(r operation.Record, currentPort tunnelport.Port) *agentv1.OperationStatus {
	if r.Staged() && (r.Phase == operation.PhaseCommitted || r.Phase == operation.PhaseConfirmed) {
		// Switched: the device keeps its own port until the retirement;
		// the port the node sends on is what the switch read back.
		currentPort = r.CurrentPort
	}
	st := &agentv1.OperationStatus{
		OperationId: r.ID,
		Phase:       toPhase(r.Phase),
		FromPort:    uint32(r.FromPort),
		ToPort:      uint32(r.ToPort),
		CurrentPort: uint32(currentPort),
		Error:       r.Error,
		RevertedBy:  r.RevertedBy,
		Strategy:    r.Strategy,
	}
	if st.Strategy == "" && r.ID != "" {
		st.Strategy = operation.StrategyAtomic
	}
	// The instant the agent undoes the operation by itself: the dead-man
	// once committed, the prepare deadline while prepared. A coordinator
	// that cannot reach the agent any more tells the operator when.
	switch {
	case r.Phase == operation.PhaseCommitted && !r.Deadline.IsZero():
		st.DeadlineUnixNano = r.Deadline.UnixNano()
	case r.Phase == operation.PhasePrepared && !r.PrepareDeadline.IsZero():
		st.DeadlineUnixNano = r.PrepareDeadline.UnixNano()
	}
	if !r.Applied.IsZero() {
		st.AppliedUnixNano = r.Applied.UnixNano()
	}
	if !r.Updated.IsZero() {
		st.UpdatedUnixNano = r.Updated.UnixNano()
	}
	return st
}

func toPhase(p operation.Phase) agentv1.Phase {
	switch p {
	case operation.PhaseIdle, operation.PhasePreparing:
		return agentv1.Phase_PHASE_IDLE
	case operation.PhasePrepared:
		return agentv1.Phase_PHASE_PREPARED
	case operation.PhaseCommitted:
		return agentv1.Phase_PHASE_COMMITTED
	case operation.PhaseConfirmed:
		return agentv1.Phase_PHASE_CONFIRMED
	case operation.PhaseReverted:
		return agentv1.Phase_PHASE_REVERTED
	case operation.PhaseAborted:
		return agentv1.Phase_PHASE_ABORTED
	case operation.PhaseFinalized:
		return agentv1.Phase_PHASE_FINALIZED
	case operation.PhaseFailed:
		return agentv1.Phase_PHASE_FAILED
	}
	return agentv1.Phase_PHASE_UNSPECIFIED
}

func grpcErr(err error) error {
	if late := operation.LateOf(err); late > 0 {
		return agentv1.LateStatus(err.Error(), late)
	}
	c := codes.Internal
	switch operation.CodeOf(err) {
	case operation.CodeInvalidArgument:
		c = codes.InvalidArgument
	case operation.CodeFailedPrecondition:
		c = codes.FailedPrecondition
	case operation.CodeNotFound:
		c = codes.NotFound
	case operation.CodeUnavailable:
		c = codes.Unavailable
	case operation.CodeAborted:
		c = codes.Aborted
	}
	return status.Error(c, err.Error())
}

// MaxOpIDLen bounds operation ids: they appear in logs, files and metrics.
const MaxOpIDLen = 128

var opIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

func checkOpID(id string) error {
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, `operation_id "": required`)
	case len(id) > MaxOpIDLen:
		return status.Errorf(codes.InvalidArgument, "operation_id %.40q...: %d characters, at most %d", id, len(id), MaxOpIDLen)
	case !opIDRe.MatchString(id):
		return status.Errorf(codes.InvalidArgument, "operation_id %q: only letters, digits, '.', '_', ':' and '-' are allowed, starting with a letter or digit", id)
	}
	return nil
}

// checkPort reads a port field of a request: the range check is
// tunnelport's, as in coordctl and the coordinator, so every layer refuses
// a bad port in the same words.
func checkPort(field string, p uint32) (tunnelport.Port, error) {
	port, err := tunnelport.From(field, int64(p))
	if err != nil {
		return 0, status.Error(codes.InvalidArgument, err.Error())
	}
	return port, nil
}
