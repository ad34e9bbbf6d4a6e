package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/pki"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

const insecureWarning = "INSECURE MODE: no TLS to agents or from coordctl; anyone who can reach these ports can change the overlay. Use only in a local lab."

// serverOptions returns the API server's credentials: mTLS requiring the
// admin role (coordctl), or none with --insecure. Every refused client is
// counted in m, plaintext and failed handshakes included.
func serverOptions(cfg Config, m *Metrics, log *slog.Logger) ([]grpc.ServerOption, error) {
	if cfg.Insecure {
		return nil, nil
	}
	r, err := m.TLSReloader(cfg.TLS, log)
	if err != nil {
		return nil, fmt.Errorf("API server TLS: %w", err)
	}
	// RoleCoordinator: a standby forwards coordctl's calls to the leader
	// with its own certificate (Server.SetForward). It grants nothing new:
	// a coordinator certificate already commands every agent.
	tc, err := pki.ReloadingServerConfig(r, m.APITLSRejected, pki.RoleAdmin, pki.RoleCoordinator)
	if err != nil {
		return nil, fmt.Errorf("API server TLS: %w", err)
	}
	return []grpc.ServerOption{grpc.Creds(pki.ServerCredentials(tc, m.APITLSRejected))}, nil
}

// metricsHandler serves /healthz (alive), /readyz (ready: the API serves
// and the journal was resumed) and /metrics.
func metricsHandler(m *Metrics, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	return mux
}

// Run validates cfg, builds the coordinator over the static inventory,
// resumes the journal and serves until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Cluster {
		return errors.New("--kube: cluster mode is run by the coordinator command (coordinator/cmd/coordinator), not by coordinator.Run")
	}
	if cfg.Insecure {
		log.Warn(insecureWarning)
	}
	inv, err := cfg.LoadInventory()
	if err != nil {
		return err
	}
	m := NewMetrics()
	c, err := New(cfg, inv, WithLogger(log), WithMetrics(m))
	if err != nil {
		return err
	}
	c.WarmAgents()
	s, err := Listen(cfg, m, log)
	if err != nil {
		c.Close()
		return err
	}
	s.Start()
	defer s.Stop()
	log.Info("coordinator serving", "listen", cfg.Listen, "agents", len(inv.Agents), "state_dir", cfg.StateDir, "insecure", cfg.Insecure)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var serveErr error
	go func() {
		select {
		case serveErr = <-s.Err():
			cancel()
		case <-lctx.Done():
		}
	}()
	s.Lead(lctx, c)
	cancel()
	return serveErr
}

// Server is one coordinator process's endpoints: the API on every
// --listen address, and /healthz /readyz /metrics. The Coordinator behind
// the API changes with leadership: in cluster mode a standby has none; it
// forwards every API call to the leader and is ready while a live leader
// exists (SetForward), or, without forwarding, refuses with UNAVAILABLE
// naming the leader and is not ready.
type Server struct {
	coordinatorv1.UnimplementedCoordinatorServiceServer

	cfg       Config
	log       *slog.Logger
	metrics   *Metrics
	grpc      *grpc.Server
	health    *health.Server
	listeners []net.Listener
	http      *http.Server
	metricsL  net.Listener
	errc      chan error

	mu      sync.Mutex
	c       *Coordinator // nil: standby (or not started)
	resumed bool
	self    string
	leader  func() (string, error) // the live leader's identity, or why none leads
	fwd     *forwarder             // nil: a standby refuses instead of forwarding
}

// Listen binds every --listen address and --metrics-listen, with the
// API's credentials from cfg; m is served on /metrics (give the same m to
// every Coordinator served, WithMetrics).
func Listen(cfg Config, m *Metrics, log *slog.Logger) (*Server, error) {
	sopts, err := serverOptions(cfg, m, log)
	if err != nil {
		return nil, err
	}
	addrs, err := cfg.ListenAddrs()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, metrics: m, errc: make(chan error, len(addrs)+1)}
	closeAll := func() {
		for _, l := range s.listeners {
			_ = l.Close()
		}
	}
	for _, a := range addrs {
		if a.Network == "unix" {
			// A socket file left by a killed coordinator would make the
			// listen fail; only a socket is removed, never another file.
			if fi, err := os.Lstat(a.Addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
				_ = os.Remove(a.Addr)
			}
		}
		l, err := net.Listen(a.Network, a.Addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("--listen %s: %w", cfg.Listen, err)
		}
		if a.Network == "unix" {
			_ = os.Chmod(a.Addr, 0o600) // coordctl runs as root next to it
		}
		s.listeners = append(s.listeners, l)
	}
	if cfg.MetricsListen != "" {
		s.metricsL, err = net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("--metrics-listen %s: %w", cfg.MetricsListen, err)
		}
		s.http = &http.Server{Handler: metricsHandler(m, s.ready), ReadHeaderTimeout: 5 * time.Second}
	}
	s.grpc = grpc.NewServer(sopts...)
	s.register(s.grpc)
	return s, nil
}

// register serves s's API, the standard health service and reflection on
// g. It is the one registration path: Listen's server and Serve's (tests
// over bufconn) both take it, so tests go through the layer production
// serves.
func (s *Server) register(g *grpc.Server) {
	coordinatorv1.RegisterCoordinatorServiceServer(g, s)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(g, s.health)
	s.health.SetServingStatus(coordinatorv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	reflection.Register(g)
}

// Serve registers on g, which the caller serves and stops, the Server that
// Listen builds in production, with c leading and taken as resumed (call
// c.Resume first). For callers that bring their own grpc.Server and
// listener, in-memory tests over bufconn above all. Closing c stays the
// caller's.
func Serve(g *grpc.Server, c *Coordinator) *Server {
	s := &Server{cfg: c.cfg, log: c.log, metrics: c.metrics, errc: make(chan error, 1)}
	s.register(g)
	s.mu.Lock()
	s.c, s.resumed = c, true
	s.mu.Unlock()
	s.health.SetServingStatus(coordinatorv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Addrs returns the bound API addresses, then the metrics address if any.
func (s *Server) Addrs() []net.Addr {
	var out []net.Addr
	for _, l := range s.listeners {
		out = append(out, l.Addr())
	}
	if s.metricsL != nil {
		out = append(out, s.metricsL.Addr())
	}
	return out
}

// Start serves in the background; Err reports a listener that failed.
func (s *Server) Start() {
	for _, l := range s.listeners {
		go func() { s.errc <- s.grpc.Serve(l) }()
	}
	if s.http != nil {
		go func() { _ = s.http.Serve(s.metricsL) }()
	}
}

// Err delivers the error of a listener that stopped serving.
func (s *Server) Err() <-chan error { return s.errc }

// Stop stops serving at once (not gracefully: a Cutover stream lasts as
// long as its operation, which stops with its Coordinator and resumes
// from the journal).
func (s *Server) Stop() {
	s.grpc.Stop()
	s.mu.Lock()
	fwd := s.fwd
	s.mu.Unlock()
	if fwd != nil {
		fwd.close()
	}
	if s.http != nil {
		_ = s.http.Close()
	}
}

// SetStandby names this instance and tells a standby how to find the
// leader, for its refusals and its /readyz: leader returns the identity of
// the replica that leads now, or an error saying why none does (the lock
// is free, or its holder stopped renewing it).
func (s *Server) SetStandby(self string, leader func() (string, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.self, s.leader = self, leader
}

// Lead serves c until ctx ends: it resumes c's journal (ready once done),
// then, when ctx ends, detaches c (back to standby) and closes it. Every
// agent call of c stops with ctx when c was built WithContext(ctx).
func (s *Server) Lead(ctx context.Context, c *Coordinator) {
	s.mu.Lock()
	s.c, s.resumed = c, false
	s.mu.Unlock()
	s.metrics.Leader.Set(1)
	s.health.SetServingStatus(coordinatorv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		if err := c.Resume(ctx); err != nil {
			s.log.Error("journal resume", "err", err)
		}
		s.mu.Lock()
		if s.c == c {
			s.resumed = true
		}
		s.mu.Unlock()
	}()
	<-ctx.Done()
	s.mu.Lock()
	s.c, s.resumed = nil, false
	s.mu.Unlock()
	s.metrics.Leader.Set(0)
	s.health.SetServingStatus(coordinatorv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	c.cancel()
	<-resumed
	c.Close()
}

// ready is /readyz: leading and the journal resumed, or a standby that
// forwards to a live leader. Both replicas of a Deployment must be Ready
// in normal operation, or a rolling update replaces the standby with
// another unready standby and can never take the leader down
// (docs/deploy.md, "Upgrades"); but a standby with no live leader to
// forward to serves nothing, and says so.
func (s *Server) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.c == nil && s.fwd != nil:
		if _, msg, ok := s.standbyLocked(); !ok {
			return errors.New(msg)
		}
		return nil
	case s.c == nil:
		_, msg, _ := s.standbyLocked()
		return errors.New(msg)
	case !s.resumed:
		return errors.New("journal: resuming interrupted operations")
	}
	return nil
}

// standbyLocked says who leads, for a standby: the leader's identity and
// ok when another replica leads, else why not in msg.
func (s *Server) standbyLocked() (leader, msg string, ok bool) {
	if s.leader == nil {
		return "", "the coordinator is not serving yet", false
	}
	who := s.self
	if who == "" {
		who = "this coordinator"
	}
	l, err := s.leader()
	switch {
	case err != nil:
		return "", fmt.Sprintf("%s is a standby and no replica leads: %v", who, err), false
	case l == "" || l == s.self:
		return "", fmt.Sprintf("%s is a standby and no leader is known yet (leader election in progress): retry in a few seconds", who), false
	}
	return l, fmt.Sprintf("%s is a standby; the leader is %s", who, l), true
}

// active returns the Coordinator serving the API or, on a standby that
// forwards, a client of the leader; otherwise UNAVAILABLE.
func (s *Server) active(ctx context.Context) (*Coordinator, coordinatorv1.CoordinatorServiceClient, error) {
	s.mu.Lock()
	c, fwd, self := s.c, s.fwd, s.self
	var msg, leader string
	if c == nil {
		leader, msg, _ = s.standbyLocked()
	}
	s.mu.Unlock()
	if c != nil {
		return c, nil, nil
	}
	if fwd == nil || leader == "" || leader == self {
		return nil, nil, status.Error(codes.Unavailable, msg)
	}
	if by := metadata.ValueFromIncomingContext(ctx, forwardedBy); len(by) > 0 {
		// Two standbys that each think the other leads (a Lease changing
		// hands) would pass a call back and forth: one hop only.
		return nil, nil, status.Errorf(codes.Unavailable, "%s: forwarded here by %s, which took this replica for the leader: leadership is changing hands, retry in a few seconds", msg, by[0])
	}
	cl, err := fwd.client(ctx, leader)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "%s; forwarding to it failed: %v", msg, err)
	}
	return nil, cl, nil
}

// forwardedBy is the metadata key a standby sets on a call it forwards.
const forwardedBy = "cutover-forwarded-by"

// forwarder dials the leader for a standby, one connection per leader
// address, kept until the leader changes.
type forwarder struct {
	addr  func(ctx context.Context, leader string) (string, error)
	opts  []grpc.DialOption
	mu    sync.Mutex
	where string
	conn  *grpc.ClientConn
}

func (f *forwarder) client(ctx context.Context, leader string) (coordinatorv1.CoordinatorServiceClient, error) {
	addr, err := f.addr(ctx, leader)
	if err != nil {
		return nil, fmt.Errorf("leader %s's address: %w", leader, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil || f.where != addr {
		if f.conn != nil {
			_ = f.conn.Close()
		}
		// A standby relays the leader's reports, which at 10,000 nodes
		// exceed gRPC's default 4 MiB per message (see cli.MaxReportBytes).
		cc, err := grpc.NewClient("passthrough:///"+addr, append(slices.Clone(f.opts), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))...)
		if err != nil {
			return nil, fmt.Errorf("dial leader %s at %s: %w", leader, addr, err)
		}
		f.conn, f.where = cc, addr
	}
	return coordinatorv1.NewCoordinatorServiceClient(f.conn), nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		_ = f.conn.Close()
		f.conn = nil
	}
}

// SetForward makes a standby forward every API call to the leader, and
// Ready while a live one leads, whose API address leaderAddr resolves from its identity, over
// ForwardDialOptions. Forwarding rather than redirecting: coordctl then
// works through any replica, `kubectl port-forward` to either pod and the
// Service alike, without reaching the leader's node IP itself.
func (s *Server) SetForward(leaderAddr func(ctx context.Context, leader string) (string, error), opts ...grpc.DialOption) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fwd = &forwarder{addr: leaderAddr, opts: opts}
}

// ForwardDialOptions are the credentials a standby forwards with: its own
// coordinator certificate, and the leader must present one too.
func ForwardDialOptions(cfg Config) ([]grpc.DialOption, error) {
	if cfg.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	tc, err := pki.ClientConfig(cfg.TLS, pki.RoleCoordinator)
	if err != nil {
		return nil, fmt.Errorf("forwarding to the leader, client TLS: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}

func (s *Server) outgoing(ctx context.Context) context.Context {
	s.mu.Lock()
	self := s.self
	s.mu.Unlock()
	return metadata.AppendToOutgoingContext(ctx, forwardedBy, self, requestedByKey, requester(ctx))
}

// relay copies a forwarded operation stream from the leader to coordctl.
func relay(recv func() (*coordinatorv1.OperationEvent, error), send func(*coordinatorv1.OperationEvent) error) error {
	for {
		ev, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(ev); err != nil {
			return err
		}
	}
}

// ListAgents implements CoordinatorService.
func (s *Server) ListAgents(ctx context.Context, r *coordinatorv1.ListAgentsRequest) (*coordinatorv1.ListAgentsResponse, error) {
	c, l, err := s.active(ctx)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return l.ListAgents(s.outgoing(ctx), r)
	}
	return c.ListAgents(ctx, r)
}

// Plan implements CoordinatorService.
func (s *Server) Plan(ctx context.Context, r *coordinatorv1.CutoverRequest) (*coordinatorv1.PlanResponse, error) {
	c, l, err := s.active(ctx)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return l.Plan(s.outgoing(ctx), r)
	}
	return c.Plan(ctx, r)
}

// PathCheck implements CoordinatorService.
func (s *Server) PathCheck(ctx context.Context, r *coordinatorv1.CutoverRequest) (*coordinatorv1.PathCheckResult, error) {
	c, l, err := s.active(ctx)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return l.PathCheck(s.outgoing(ctx), r)
	}
	return c.PathCheck(ctx, r)
}

// Cutover implements CoordinatorService.
func (s *Server) Cutover(r *coordinatorv1.CutoverRequest, st grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	c, l, err := s.active(st.Context())
	if err != nil {
		return err
	}
	if l != nil {
		fs, err := l.Cutover(s.outgoing(st.Context()), r)
		if err != nil {
			return err
		}
		return relay(fs.Recv, st.Send)
	}
	return c.Cutover(r, st)
}

// Status implements CoordinatorService.
func (s *Server) Status(ctx context.Context, r *coordinatorv1.StatusRequest) (*coordinatorv1.Report, error) {
	c, l, err := s.active(ctx)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return l.Status(s.outgoing(ctx), r)
	}
	return c.Status(ctx, r)
}

// Rollback implements CoordinatorService.
func (s *Server) Rollback(r *coordinatorv1.RollbackRequest, st grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	c, l, err := s.active(st.Context())
	if err != nil {
		return err
	}
	if l != nil {
		fs, err := l.Rollback(s.outgoing(st.Context()), r)
		if err != nil {
			return err
		}
		return relay(fs.Recv, st.Send)
	}
	return c.Rollback(r, st)
}
