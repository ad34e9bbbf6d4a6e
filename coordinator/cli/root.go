package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/pkg/pki"
)

// Exit codes. Documented in the package doc and `coordctl help exit-codes`;
// tests assert them.
const (
	ExitOK          = 0 // success
	ExitFailed      = 1 // the operation was aborted or rolled back (cluster consistent, not changed as asked); other errors
	ExitUsage       = 2 // bad input: flags, arguments, or the coordinator refused the request as invalid (I6)
	ExitUnreachable = 3 // coordinator unreachable, TLS/mTLS failure, or not authorised
	ExitProblems    = 4 // plan/preflight found problems; nothing was changed
	ExitOpFailed    = 5 // the operation ended FAILED: an operator is needed
	ExitInterrupted = 6 // the stream ended before a final report: the operation may still be running (coordctl status)
	ExitWarnings    = 7 // the operation SUCCEEDED with warnings (a late node applied, the overlay was split meanwhile): every node is on the new port, look at the report
)

// DefaultCoordinator is the --coordinator default: the coordinator's own
// default listen port (coordinator.Default().Listen) on loopback.
const DefaultCoordinator = "127.0.0.1:9446"

// ExitError carries an exit code with an error. Commands return it (also
// the ones added with AddCommand); Execute prints Err and returns Code.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Exitf returns an *ExitError with a formatted message.
func Exitf(code int, format string, args ...any) error {
	return &ExitError{Code: code, Err: fmt.Errorf(format, args...)}
}

// usageError is a bad-input error (exit 2).
func usageError(format string, args ...any) error { return Exitf(ExitUsage, format, args...) }

// Globals are the persistent flags and the output streams every command
// shares. Commands added with AddCommand receive it.
type Globals struct {
	Stdout, Stderr io.Writer

	Coordinator string
	TLS         pki.Files
	TLSDir      string
	Insecure    bool
	Output      string // text, wide, json or html
	Timeout     time.Duration

	// Resolve, when set, runs before every connection: it may set
	// Coordinator and the TLS identity (the kubectl plugin finds them in
	// the cluster) and returns what to close with the connection.
	Resolve func(g *Globals) (io.Closer, error)

	timeoutSet bool        // --timeout given explicitly
	tlsConfig  *tls.Config // set by Dial; used to diagnose handshake failures
}

// JSON reports whether -o json was asked for.
func (g *Globals) JSON() bool { return g.Output == "json" }

var extensions []func(root *cobra.Command, g *Globals)

// AddCommand registers a function that adds commands to every root NewRoot
// builds. Call it from an init function of the package that provides them,
// and import that package in main.
func AddCommand(f func(root *cobra.Command, g *Globals)) { extensions = append(extensions, f) }

// NewRoot builds the coordctl command tree writing to stdout and stderr.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &Globals{Stdout: stdout, Stderr: stderr}
	root := &cobra.Command{
		Use:   "coordctl",
		Short: "Change a live cluster's VXLAN overlay port on every node at once",
		Long: `coordctl drives a Cutover coordinator over mutual TLS: list agents, plan a
port change, run it under a barrier with a scheduled commit and dead-man
revert, follow and roll back operations.

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			g.timeoutSet = cmd.Flags().Changed("timeout")
			return g.validate(cmd)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Flag parsing errors are usage errors (exit 2); cobra's own messages
	// already name the flag and the value.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError("%v (see %s --help)", err, cmd.CommandPath())
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.Coordinator, "coordinator", DefaultCoordinator, "coordinator gRPC address: host:port or unix:/path")
	pf.StringVar(&g.TLSDir, "tls-dir", "", "directory with coordctl's identity: ca.pem, admin.pem, admin-key.pem (made by coordctl certs) or ca.crt, tls.crt, tls.key (a cert-manager Secret's keys); --tls-* override single files")
	g.TLS.AddFlags(pf, "the coordinator's certificate", "coordctl (role admin)")
	pf.BoolVar(&g.Insecure, "insecure", false, "talk to the coordinator WITHOUT TLS: local labs only")
	pf.StringVarP(&g.Output, "output", "o", "text", "output format: text, json, wide (plan: every node's actions) or html (report: the change record page)")
	pf.DurationVar(&g.Timeout, "timeout", 30*time.Second, "deadline of each request; for cutover and rollback the per-step deadline on the agents (coordctl waits up to 10x for the whole operation)")

	root.AddCommand(
		newAgentsCmd(g),
		newPlanCmd(g),
		newPathCheckCmd(g),
		newCutoverCmd(g),
		newStatusCmd(g),
		newReportCmd(g),
		newRollbackCmd(g),
		newCertsCmd(g),
		newVersionCmd(g),
		newMachineConfigCmd(g),
		newExitCodesTopic(),
	)
	for _, f := range extensions {
		f(root, g)
	}
	return root
}

// TLSDirFiles is --tls-dir's identity in dir: coordctl certs' layout
// (ca.pem, admin.pem, admin-key.pem) if admin.pem is there, else a
// Kubernetes TLS Secret's (ca.crt, tls.crt, tls.key: cert-manager's
// cutover-admin-tls, mounted or saved as files).
func TLSDirFiles(dir string) (pki.Files, error) {
	own := pki.AdminFiles(dir)
	if _, err := os.Stat(own.Cert); err == nil {
		return own, nil
	}
	sec := pki.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	if _, err := os.Stat(sec.Cert); err == nil {
		return sec, nil
	}
	return pki.Files{}, fmt.Errorf("--tls-dir %s: neither admin.pem (coordctl certs) nor tls.crt (a Secret of cutover-admin-tls) is there: "+
		"save the admin Secret's ca.crt, tls.crt and tls.key into it (docs/deploy.md) or run coordctl certs --dir %s", dir, dir)
}

// maxTimeout bounds --timeout: beyond an hour it is a typo (3000h for 30s),
// and the dead-man timers on the agents would be meaningless against it.
const maxTimeout = time.Hour

func (g *Globals) validate(cmd *cobra.Command) error {
	switch g.Output {
	case "text", "json", "wide":
	case "html":
		if cmd.Name() != "report" {
			return usageError("-o/--output %q: only coordctl report writes html; %s takes text, wide or json", g.Output, cmd.CommandPath())
		}
	default:
		return usageError("-o/--output %q: unknown format, want text, json, wide or html", g.Output)
	}
	if g.Timeout <= 0 {
		return usageError("--timeout %s: must be positive (e.g. 30s)", g.Timeout)
	}
	if g.Timeout > maxTimeout {
		return usageError("--timeout %s: longer than %s; a step that takes this long is stuck (e.g. 30s)", g.Timeout, maxTimeout)
	}
	return nil
}

// Execute runs coordctl with args, writing to stdout and stderr, and returns
// the exit code.
func Execute(args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		// Errors that are not ours come from cobra itself: unknown command,
		// wrong number of arguments. Those are usage errors.
		ee = &ExitError{Code: ExitUsage, Err: err}
	}
	// The command's own name: coordctl, or kubectl-cutover for the plugin.
	_, _ = fmt.Fprintf(stderr, "%s: %v\n", root.Name(), ee.Err)
	return ee.Code
}

// Main is Execute on the process's stdout and stderr.
func Main(args []string) int { return Execute(args, os.Stdout, os.Stderr) }

// rpcError turns an error of an RPC into an *ExitError with a message made
// of the gRPC status (never a Go dump). stream tells whether the call was
// an operation stream, where a deadline or cancel means the outcome is
// unknown rather than that the coordinator is unreachable.
func rpcError(g *Globals, what string, err error, stream bool) error {
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return &ExitError{Code: ExitFailed, Err: fmt.Errorf("%s: %w", what, err)}
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.OutOfRange, codes.AlreadyExists:
		return Exitf(ExitUsage, "%s: the coordinator refused the request (%s): %s", what, st.Code(), msg)
	case codes.FailedPrecondition:
		return Exitf(ExitProblems, "%s: the coordinator refused the request (%s): %s", what, st.Code(), msg)
	case codes.Unavailable, codes.Unauthenticated, codes.PermissionDenied:
		if st.Code() == codes.Unavailable && !tlsish(msg) && g.tlsConfig != nil {
			// When the coordinator rejects our certificate after a TLS 1.3
			// handshake, gRPC reports whatever the socket said last
			// ("broken pipe", "EOF"). A second, bare handshake shows the
			// alert the coordinator sent.
			if d := diagnoseTLS(g.Coordinator, g.tlsConfig, g.Timeout); d != "" {
				msg = d + " (gRPC said: " + msg + ")"
			}
		}
		if tlsish(msg) {
			hint := "check --tls-ca/--tls-cert/--tls-key"
			switch {
			case strings.Contains(msg, "pki: server certificate rejected"):
				hint = "coordctl rejected the coordinator's certificate: --tls-ca must be the CA that issued it, and it must have role coordinator"
			case strings.Contains(msg, "remote error"):
				hint = "the coordinator rejected coordctl's certificate: --tls-cert must be issued by the coordinator's CA with role admin (coordctl certs makes admin.pem)"
			}
			return Exitf(ExitUnreachable, "%s: TLS with coordinator %s failed (%s): %s; %s", what, g.Coordinator, st.Code(), msg, hint)
		}
		hint := ""
		if st.Code() == codes.Unavailable {
			hint = "; is the coordinator running and listening there?"
		}
		return Exitf(ExitUnreachable, "%s: coordinator %s unreachable (%s): %s%s", what, g.Coordinator, st.Code(), msg, hint)
	case codes.DeadlineExceeded, codes.Canceled:
		if stream {
			return Exitf(ExitInterrupted, "%s: stopped waiting (%s: %s); the operation may still be running on the coordinator: see coordctl status", what, st.Code(), msg)
		}
		if st.Code() == codes.DeadlineExceeded {
			return Exitf(ExitUnreachable, "%s: no answer from coordinator %s within --timeout %s: %s", what, g.Coordinator, g.Timeout, msg)
		}
	}
	return Exitf(ExitFailed, "%s: %s: %s", what, st.Code(), msg)
}

func tlsish(msg string) bool {
	for _, s := range []string{"tls:", "x509", "certificate", "authentication handshake", "pki:"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
