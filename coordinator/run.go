package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cutover-dev/cutover/pkg/pki"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

const insecureWarning = "INSECURE MODE: no TLS to agents or from coordctl; anyone who can reach these ports can change the overlay. Use only in a local lab."

// agentDialOptions returns the credentials used to dial agents: mTLS
// presenting our certificate and requiring the agent role, or plaintext
// with --insecure.
func agentDialOptions(cfg Config) ([]grpc.DialOption, error) {
	if cfg.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	tc, err := pki.ClientConfig(cfg.TLS, pki.RoleAgent)
	if err != nil {
		return nil, fmt.Errorf("agent client TLS: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}

// serverOptions returns the API server's credentials: mTLS requiring the
// admin role (coordctl), or none with --insecure.
func serverOptions(cfg Config) ([]grpc.ServerOption, error) {
	if cfg.Insecure {
		return nil, nil
	}
	tc, err := pki.ServerConfig(cfg.TLS, pki.RoleAdmin)
	if err != nil {
		return nil, fmt.Errorf("API server TLS: %w", err)
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}, nil
}

// Register serves c, the standard health service and reflection on s.
func (c *Coordinator) Register(s *grpc.Server) *health.Server {
	coordinatorv1.RegisterCoordinatorServiceServer(s, c)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	hs.SetServingStatus(coordinatorv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(s)
	return hs
}

// MetricsHandler serves /healthz (alive), /readyz (ready: the API serves
// and the journal was resumed) and /metrics.
func (c *Coordinator) MetricsHandler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(c.metrics.Registry, promhttp.HandlerOpts{}))
	return mux
}

// Run validates cfg, builds the coordinator, resumes the journal and
// serves until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Insecure {
		log.Warn(insecureWarning)
	}
	inv, err := cfg.LoadInventory()
	if err != nil {
		return err
	}
	sopts, err := serverOptions(cfg)
	if err != nil {
		return err
	}
	c, err := New(cfg, inv, WithLogger(log))
	if err != nil {
		return err
	}
	defer c.Close()
	addrs, err := cfg.listenAddrs()
	if err != nil {
		return err
	}
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}
	for _, a := range addrs {
		if a.network == "unix" {
			// A socket file left by a killed coordinator would make the
			// listen fail; only a socket is removed, never another file.
			if fi, err := os.Lstat(a.addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
				_ = os.Remove(a.addr)
			}
		}
		l, err := net.Listen(a.network, a.addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
		}
		if a.network == "unix" {
			_ = os.Chmod(a.addr, 0o600) // coordctl runs as root next to it
		}
		listeners = append(listeners, l)
	}
	lis := listeners[0]
	srv := grpc.NewServer(sopts...)
	c.Register(srv)
	resumed := make(chan struct{})
	readyErr := func() error {
		select {
		case <-resumed:
			return nil
		default:
			return errors.New("journal: resuming interrupted operations")
		}
	}
	var hsrv *http.Server
	if cfg.MetricsListen != "" {
		ml, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			closeAll()
			return fmt.Errorf("--metrics-listen %s: %w", cfg.MetricsListen, err)
		}
		hsrv = &http.Server{Handler: c.MetricsHandler(readyErr), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hsrv.Serve(ml) }()
	}
	errc := make(chan error, len(listeners))
	for _, l := range listeners[1:] {
		go func() { errc <- srv.Serve(l) }()
	}
	go func() { errc <- srv.Serve(lis) }()
	log.Info("coordinator serving", "listen", cfg.Listen, "agents", len(inv.Agents), "state_dir", cfg.StateDir, "insecure", cfg.Insecure)
	go func() {
		if err := c.Resume(ctx); err != nil {
			log.Error("journal resume", "err", err)
		}
		close(resumed)
	}()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	// Stop, not GracefulStop: a Cutover stream lasts as long as its
	// operation; the operation itself stops at Close and resumes from the
	// journal at the next start.
	c.cancel()
	srv.Stop()
	if hsrv != nil {
		_ = hsrv.Close()
	}
	return err
}
