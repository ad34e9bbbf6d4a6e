package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cutover-dev/cutover/pkg/pki"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

const insecureWarning = `WARNING: --insecure: talking to the coordinator WITHOUT TLS. Nothing is
WARNING: authenticated or encrypted; anyone on the path can read or forge
WARNING: commands that change the cluster overlay. Use it for local labs only.
`

// Dial validates the connection flags and returns a client of the
// coordinator. It makes no connection yet (grpc.NewClient is lazy), so a
// command can validate its own flags, then Dial, then call: no byte is
// sent before all input was checked.
func (g *Globals) Dial() (coordinatorv1.CoordinatorServiceClient, io.Closer, error) {
	var resolved io.Closer
	if g.Resolve != nil {
		// The kubectl plugin finds the coordinator and its identity here
		// (a port-forward, the admin Secret): only once the command's own
		// input was checked, as for any connection.
		c, err := g.Resolve(g)
		if err != nil {
			return nil, nil, err
		}
		resolved = c
	}
	client, conn, err := g.dial()
	if resolved == nil || err != nil {
		if resolved != nil {
			_ = resolved.Close()
		}
		return client, conn, err
	}
	return client, closers{conn, resolved}, nil
}

// closers closes each in order and returns the first error.
type closers []io.Closer

func (cs closers) Close() error {
	var first error
	for _, c := range cs {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (g *Globals) dial() (coordinatorv1.CoordinatorServiceClient, io.Closer, error) {
	if err := validateHostPort("--coordinator", g.Coordinator); err != nil {
		return nil, nil, err
	}
	var creds credentials.TransportCredentials
	if g.Insecure {
		if g.TLSDir != "" || g.TLS != (pki.Files{}) {
			return nil, nil, usageError("--insecure together with --tls-dir/--tls-ca/--tls-cert/--tls-key: choose one (TLS unless this is a local lab)")
		}
		_, _ = io.WriteString(g.Stderr, insecureWarning)
		creds = insecure.NewCredentials()
	} else {
		files := g.TLS
		if g.TLSDir != "" {
			d, err := TLSDirFiles(g.TLSDir)
			if err != nil && (files.CA == "" || files.Cert == "" || files.Key == "") {
				return nil, nil, &ExitError{Code: ExitUsage, Err: err}
			}
			if files.CA == "" {
				files.CA = d.CA
			}
			if files.Cert == "" {
				files.Cert = d.Cert
			}
			if files.Key == "" {
				files.Key = d.Key
			}
		}
		if files == (pki.Files{}) {
			return nil, nil, usageError("no TLS identity: give --tls-dir D (made by `coordctl certs --dir D`) or --tls-ca, --tls-cert and --tls-key; --insecure only for local labs")
		}
		if err := files.Validate(); err != nil {
			return nil, nil, &ExitError{Code: ExitUsage, Err: err}
		}
		cfg, err := pki.ClientConfig(files, pki.RoleCoordinator)
		if err != nil {
			return nil, nil, &ExitError{Code: ExitUsage, Err: err}
		}
		g.tlsConfig = cfg
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(g.Coordinator, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxReportBytes)))
	if err != nil {
		return nil, nil, usageError("--coordinator %q: %v", g.Coordinator, err)
	}
	return coordinatorv1.NewCoordinatorServiceClient(conn), conn, nil
}

// MaxReportBytes bounds one message coordctl accepts. gRPC's default, 4
// MiB, is less than the report of an operation over 10,000 nodes (6.7 MB
// measured by BenchmarkCoordinatorScaleSim, node results and probe pairs
// included), which comes as one message at the end of the stream.
const MaxReportBytes = 256 << 20

// diagnoseTLS makes one bare TLS connection to addr and returns why the
// handshake or the first read failed, or "" when TLS works (the server then
// waits for the HTTP/2 preface and the read times out).
func diagnoseTLS(addr string, cfg *tls.Config, timeout time.Duration) string {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"} // gRPC servers insist on ALPN h2
	d := &net.Dialer{Timeout: min(timeout, 5*time.Second)}
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", "/"+strings.TrimLeft(path, "/")
	}
	conn, err := tls.DialWithDialer(d, network, addr, cfg)
	if err != nil {
		return "TLS handshake failed: " + err.Error()
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return ""
	}
	return "the coordinator rejected coordctl's certificate: " + err.Error()
}

func validateHostPort(flag, v string) error {
	if path, ok := strings.CutPrefix(v, "unix:"); ok {
		if !strings.HasPrefix(path, "/") || strings.Trim(path, "/") == "" {
			return usageError("%s %q: unix: needs an absolute socket path, e.g. unix:/run/cutover-lab/lab/coordinator.sock", flag, v)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return usageError("%s %q: not host:port (e.g. 127.0.0.1:9444): %v", flag, v, err)
	}
	if host == "" {
		return usageError("%s %q: no host: give the coordinator's address, e.g. 127.0.0.1%s", flag, v, v)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return usageError("%s %q: port %q is not a number in 1-65535", flag, v, port)
	}
	return nil
}

func fmtMillis(nanos int64) string { return fmt.Sprintf("%.3f", float64(nanos)/1e6) }
