package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/agent/probe"
	"github.com/cutover-dev/cutover/pkg/callstream"
	"github.com/cutover-dev/cutover/pkg/ifaddr"
	"github.com/cutover-dev/cutover/pkg/pki"
	"github.com/cutover-dev/cutover/pkg/version"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	callstreamv1 "github.com/cutover-dev/cutover/proto/callstream/v1"
)

// Option adjusts Run, mostly for tests and in-process simulations.
type Option func(*runOptions)

type runOptions struct {
	backend          dataplane.Backend
	grpcLn, httpLn   net.Listener
	registry         *prometheus.Registry
	clock            operation.Clock
	logger           *slog.Logger
	shutdownDeadline time.Duration
	addrs            ifaddr.Reader
	tlsReload        time.Duration
}

// WithBackend uses b instead of building the backend from the config
// (NewBackend): a dataplane.Fake in tests and simulated clusters.
func WithBackend(b dataplane.Backend) Option { return func(o *runOptions) { o.backend = b } }

// WithListeners serves gRPC and HTTP on the given listeners instead of
// listening on the configured addresses (e.g. 127.0.0.1:0, or bufconn).
// Run closes them.
func WithListeners(grpcLn, httpLn net.Listener) Option {
	return func(o *runOptions) { o.grpcLn, o.httpLn = grpcLn, httpLn }
}

// WithRegistry registers the metrics in reg (default: a fresh registry with
// the Go and process collectors).
func WithRegistry(reg *prometheus.Registry) Option { return func(o *runOptions) { o.registry = reg } }

// WithClock sets the machine's clock (default: the wall clock).
func WithClock(c operation.Clock) Option { return func(o *runOptions) { o.clock = c } }

// WithInterfaceAddrs reads the overlay address from r instead of the host's
// netlink (an ifaddr.Fake in tests, a namespace's ifaddr.Kernel).
func WithInterfaceAddrs(r ifaddr.Reader) Option { return func(o *runOptions) { o.addrs = r } }

// WithTLSReloadInterval looks at the certificate files at most every d
// (default pki.DefaultReloadInterval).
func WithTLSReloadInterval(d time.Duration) Option { return func(o *runOptions) { o.tlsReload = d } }

// WithLogger sets the logger (default: text to stderr at --log-level).
func WithLogger(l *slog.Logger) Option { return func(o *runOptions) { o.logger = l } }

// Run serves the agent until ctx is cancelled, then stops gracefully. It
// returns an error when the config is invalid, a listener or the TLS setup
// fails, or the operation record cannot be read. A backend that cannot be
// set up is not fatal: the agent keeps serving /healthz, /readyz says why,
// and the setup is retried every --backend-retry (OVS may start later).
func Run(ctx context.Context, cfg Config, opts ...Option) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	o := runOptions{clock: operation.RealClock{}, shutdownDeadline: 5 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	log := o.logger
	if log == nil {
		log = NewLogger(cfg.LogLevel)
	}
	log = log.With("node", cfg.NodeName)
	reg := o.registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	metrics := NewMetrics(reg)

	var creds credentials.TransportCredentials
	if cfg.Insecure {
		log.Warn("!!! INSECURE MODE: gRPC without TLS, ANY caller can change this node's dataplane. " +
			"--insecure is for local labs only; never use it on a real cluster.")
		creds = insecure.NewCredentials()
	} else {
		// Re-read when cert-manager renews the Secret: no restart.
		files := cfg.TLS
		r, err := pki.NewReloader(files, pki.ReloadOptions{
			Interval: o.tlsReload,
			OnReload: func() {
				metrics.TLSReloaded(nil)
				log.Info("TLS certificates reloaded from disk", "cert", files.Cert, "ca", files.CA)
			},
			OnError: func(err error) {
				metrics.TLSReloaded(err)
				log.Error("TLS certificates changed on disk but cannot be used", "err", err)
			},
		})
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		tc, err := pki.ReloadingServerConfig(r, metrics.TLSRejected, pki.RoleCoordinator)
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		// Also counts what never reaches the certificate check:
		// plaintext to this port, a failed TLS handshake.
		creds = pki.ServerCredentials(tc, metrics.TLSRejected)
	}

	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		log.Error("cannot create the state dir: operations are refused until it is writable", "err", err)
	}
	store := operation.FileStore{Dir: cfg.StateDir}
	svc := NewService(cfg, o.clock, store, metrics)
	var probes *overlayProbe
	if cfg.Probe {
		pc, err := cfg.probeConfig()
		if err != nil {
			return err
		}
		// The mesh's times are the agent's clock, the one Commit instants
		// are given in, so the coordinator can compare them.
		pc.Now = o.clock.Now
		mesh, err := probe.New(pc)
		if err != nil {
			return fmt.Errorf("probe mesh: %w", err)
		}
		reg.MustRegister(mesh.Collector())
		probes = newOverlayProbe(cfg, mesh)
		svc.SetProbes(probes)
	}

	counted := metrics.UnaryInterceptor()
	// Fixed flow-control windows (callstream.ServerOptions): no
	// bandwidth-delay pings beside every call the coordinator sends.
	srv := grpc.NewServer(append(callstream.ServerOptions(), grpc.Creds(creds), grpc.ChainUnaryInterceptor(counted))...)
	// The coordinator's calls come over one stream per connection
	// (pkg/callstream), each through the same handler and interceptor.
	calls := callstream.NewServer(&agentv1.AgentService_ServiceDesc, svc, counted)
	agentv1.RegisterAgentServiceServer(srv, callStreams{svc, calls})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	serviceName := agentv1.AgentService_ServiceDesc.ServiceName
	hs.SetServingStatus(serviceName, healthpb.HealthCheckResponse_NOT_SERVING)
	reflection.Register(srv)

	grpcLn, httpLn := o.grpcLn, o.httpLn
	if grpcLn == nil {
		l, err := net.Listen("tcp", cfg.ListenAddr)
		if err != nil {
			return fmt.Errorf("--listen %q: %w", cfg.ListenAddr, err)
		}
		grpcLn = l
	}
	if httpLn == nil {
		l, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			_ = grpcLn.Close()
			return fmt.Errorf("--metrics-listen %q: %w", cfg.MetricsAddr, err)
		}
		httpLn = l
	}
	httpSrv := &http.Server{Handler: HTTPHandler(svc.NotReady, reg), ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 3)
	go func() {
		if err := srv.Serve(grpcLn); err != nil {
			errc <- fmt.Errorf("gRPC server on %s: %w", grpcLn.Addr(), err)
		}
	}()
	go func() {
		if err := httpSrv.Serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("HTTP server on %s: %w", httpLn.Addr(), err)
		}
	}()
	log.Info("agent serving", "version", version.Version, "grpc", grpcLn.Addr().String(),
		"http", httpLn.Addr().String(), "backend", cfg.Backend, "state_dir", cfg.StateDir, "tls", !cfg.Insecure)

	setupCtx, cancelSetup := context.WithCancel(ctx)
	defer cancelSetup()
	if probes != nil {
		go func() {
			var opened *ifaddr.Kernel
			openAddrs := func() (ifaddr.Reader, error) {
				if o.addrs != nil {
					return o.addrs, nil
				}
				k, err := ifaddr.Open("")
				if err != nil {
					return nil, err
				}
				opened = k
				return k, nil
			}
			probes.run(setupCtx, probeLookupEvery, openAddrs, log)
			if opened != nil {
				opened.Close()
			}
		}()
	}
	if cfg.PortRefresh > 0 {
		go refreshPort(setupCtx, svc, cfg.PortRefresh, cfg.CallTimeout)
	}
	if probes != nil {
		go svc.lingerProbes(setupCtx, cfg.ProbeLinger, min(cfg.ProbeLinger/4+time.Second, 30*time.Second), log)
	}
	machc := make(chan *operation.Machine, 1)
	go func() {
		m, err := setupCore(setupCtx, cfg, o, svc, store, metrics, log)
		if err != nil {
			errc <- err
		}
		if m != nil {
			hs.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
			if _, be, err := svc.core(); err == nil {
				if k, ok := be.(dataplane.Keeper); ok {
					go keepBackend(setupCtx, k, keepEvery, cfg.CallTimeout, metrics, log)
				}
				if k, ok := be.(dataplane.PortKeeper); ok {
					go keepPortOpen(setupCtx, m, k, keepEvery, cfg.CallTimeout, metrics, log)
				}
			}
		}
		machc <- m
	}()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case runErr = <-errc:
		log.Error("stopping on error", "err", runErr)
	}
	hs.Shutdown()
	stopped := make(chan struct{})
	// The call streams end once their calls have answered: GracefulStop
	// would otherwise wait for them until the deadline.
	calls.Drain()
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(o.shutdownDeadline):
		srv.Stop()
		<-stopped
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownDeadline)
	defer cancel()
	_ = httpSrv.Shutdown(sctx)
	cancelSetup()
	if m := <-machc; m != nil {
		m.Close() // the record keeps any deadline; a restarted agent re-arms it
	}
	return runErr
}

// setupCore builds the backend (retrying while it fails) and the operation
// machine over the persisted record. It returns (nil, nil) when ctx ends
// first, and an error only when the record cannot be read.
// afterCommitHold caps how long an answered commit's after-work waits for
// the other nodes' windows (operation.Options.AfterCommitHold).
const afterCommitHold = 500 * time.Millisecond

func setupCore(ctx context.Context, cfg Config, o runOptions, svc *Service, store operation.Store, metrics *Metrics, log *slog.Logger) (*operation.Machine, error) {
	var lastErr string
	for {
		be := o.backend
		var err error
		if be == nil {
			be, err = NewBackend(cfg)
		}
		if err == nil {
			m, err := operation.New(ctx, operation.Options{
				Backend:        be,
				Store:          store,
				Clock:          o.clock,
				PrepareTimeout: cfg.PrepareTimeout,
				CallTimeout:    cfg.CallTimeout,
				Observer:       metrics,
				Logger:         log,
				FlipDelay:      flipDelay(), // nil but in the test-only build
				// The lateness budget (the coordinator's 200 ms by
				// default), up to this.
				AfterCommitHold: afterCommitHold,
			})
			if err != nil {
				return nil, fmt.Errorf("operation record: %w", err)
			}
			svc.SetCore(m, be)
			if st, err := be.Read(ctx); err == nil {
				metrics.PortObserved(st.Port)
				log.Info("backend ready", "backend", be.Name(), "device", be.Device(), "port", st.Port)
			} else {
				log.Warn("backend up but its state cannot be read", "backend", be.Name(), "err", err)
			}
			return m, nil
		}
		svc.SetBackendError(err)
		if err.Error() != lastErr { // once per distinct cause, not every retry
			log.Error("backend not available; serving /healthz and retrying", "err", err, "retry_every", cfg.BackendRetry)
			lastErr = err.Error()
		} else {
			log.Debug("backend still not available", "err", err)
		}
		t := time.NewTimer(cfg.BackendRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
	}
}

// NewLogger returns the agent's text logger on stderr at level (debug,
// info, warn, error).
func NewLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// refreshPort keeps cutover_agent_current_port true to the dataplane.
func refreshPort(ctx context.Context, svc *Service, every, timeout time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, min(timeout, every))
			svc.ObservePort(cctx)
			cancel()
		}
	}
}

// keepEvery is how often a dataplane.Keeper's state is checked: a minute
// at most with something in the way of what it keeps (the OVS standing
// redirects: another interface on one of their numbers).
const keepEvery = time.Minute

// keepBackend calls k.Keep now and every every, logging what it repaired
// or why it could not.
func keepBackend(ctx context.Context, k dataplane.Keeper, every, timeout time.Duration, metrics *Metrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		changed, err := k.Keep(cctx)
		cancel()
		metrics.StandingChecked(changed, err)
		switch {
		case err != nil:
			log.Warn("backend: cannot keep its standing state; retrying", "err", err, "retry_in", every)
		case changed:
			log.Info("backend: standing state put in place", "backend", k.Name())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// keepPortOpen has k keep the overlay's current port open in the firewall
// now and every every: a node that rebooted or joined after a cutover
// must still accept the overlay's traffic on it. Stale marked rules of other ports go
// only while m has no operation in flight: an undo may go back to them.
// Nothing is removed when the agent stops: in a DaemonSet rolling update
// the old pod stops before the new one starts, and the port must stay open
// between them (`cutover-agent cleanup` removes the rules on uninstall).
func keepPortOpen(ctx context.Context, m *operation.Machine, k dataplane.PortKeeper, every, timeout time.Duration, metrics *Metrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	first := true
	for {
		rec, _ := m.Status("")
		cctx, cancel := context.WithTimeout(ctx, timeout)
		kept, err := k.KeepPortOpen(cctx, !rec.Phase.InFlight())
		cancel()
		metrics.PortKept(len(kept.Opened) > 0, err)
		switch {
		case err != nil:
			log.Warn("firewall: cannot keep the overlay port open; retrying", "err", err, "retry_in", every)
		case len(kept.Opened) > 0:
			log.Info("firewall: overlay port opened (it had no rule)", "port", kept.Port, "added", kept.Opened, "removed_stale", kept.Removed)
		case first || len(kept.Removed) > 0:
			log.Info("firewall: overlay port found open", "port", kept.Port, "rules", kept.Found, "removed_stale", kept.Removed)
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// callStreams is the agent's service with its Calls method: the calls
// above, one frame each, over one stream (pkg/callstream).
type callStreams struct {
	agentv1.AgentServiceServer
	calls *callstream.Server
}

func (c callStreams) Calls(st grpc.BidiStreamingServer[callstreamv1.Frame, callstreamv1.Frame]) error {
	return c.calls.Serve(st)
}
