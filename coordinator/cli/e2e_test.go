package cli

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/pkg/pki"
)

// TestEndToEndRealCoordinator runs coordctl against the real coordinator,
// which drives fake agents; every hop is mTLS over 127.0.0.1 with
// certificates from `coordctl certs`. It proves the contract between the
// CLI and the coordinator as built, not as the fake server imagines it.
func TestEndToEndRealCoordinator(t *testing.T) {
	dir := certsDir(t) // agents n1, n2
	fakes := map[string]*fakeagent.Agent{}
	var specs []coordinator.AgentSpec
	for _, n := range []string{"n1", "n2"} {
		f := fakeagent.New(n, 4789)
		fakes[n] = f
		specs = append(specs, coordinator.AgentSpec{Node: n, Address: serveFakeAgent(t, dir, n, f), Labels: map[string]string{"rack": n}})
	}
	inv, err := coordinator.NewInventory("test", specs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Default()
	cfg.StateDir = t.TempDir()
	cfg.TLS = pki.CoordinatorFiles(dir)
	cfg.StepTimeout = 2 * time.Second
	cfg.Deadman = 5 * time.Second
	cfg.RollbackAttempts = 2
	c, err := coordinator.New(cfg, inv, coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv, addr := serveMTLS(t, c, dir)
	t.Cleanup(srv.Stop)
	base := []string{"--coordinator", addr, "--tls-dir", dir}
	ctl := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, append(append([]string{}, base...), args...)...)
	}

	code, stdout, stderr := ctl("agents")
	if code != ExitOK || strings.Count(stdout, "4789") != 2 || !strings.Contains(stdout, "yes") {
		t.Fatalf("agents: exit %d\n%s\n%s", code, stdout, stderr)
	}

	// The coordinator's own validation comes back as a clear message, exit 2.
	code, _, stderr = ctl("plan", "--port", "30080")
	if code != ExitUsage || !strings.Contains(stderr, "NodePort range") || strings.Contains(stderr, "rpc error") {
		t.Errorf("plan in NodePort range: exit %d: %s", code, stderr)
	}
	code, _, stderr = ctl("plan", "--port", "4889", "--nodes", "n9")
	if code != ExitUsage || !strings.Contains(stderr, "n9") {
		t.Errorf("plan unknown node: exit %d: %s", code, stderr)
	}

	// A subset of the overlay would split it: a preflight
	// problem naming who would be cut off from whom, exit 4.
	code, stdout, stderr = ctl("plan", "--port", "4889", "--nodes", "n1")
	if code != ExitProblems || !strings.Contains(strings.ReplaceAll(stdout, "\n    ", " "), "n1 would move to 4889 while n2 stays on 4789: n1 could no longer reach n2 over the overlay; target every node of the overlay") {
		t.Errorf("plan of a subset: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, _, stderr = ctl("cutover", "--port", "4889", "--nodes", "n1"); code != ExitProblems || !strings.Contains(stderr, "could no longer reach n2") {
		t.Errorf("cutover of a subset: exit %d: %s", code, stderr)
	}

	// Preflight problems: exit 4 for plan and for a dry run; nothing moved.
	fakes["n2"].HoldPort(4890, "dnsmasq")
	if code, stdout, stderr = ctl("plan", "--port", "4890"); code != ExitProblems || !strings.Contains(stdout, "dnsmasq") {
		t.Errorf("plan with a busy port: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, _, stderr = ctl("cutover", "--port", "4890", "--dry-run"); code != ExitProblems || !strings.Contains(stderr, "FailedPrecondition") {
		t.Errorf("dry run with a busy port: exit %d: %s", code, stderr)
	}
	if code, stdout, stderr = ctl("cutover", "--port", "4889", "--dry-run"); code != ExitOK {
		t.Errorf("dry run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for n, f := range fakes {
		if f.Port() != 4789 || f.Called("Prepare") {
			t.Errorf("%s changed by plan/dry run: port %d calls %v", n, f.Port(), f.CallLog())
		}
	}

	// The real thing.
	code, stdout, stderr = ctl("cutover", "--port", "4889", "--timeout", "2s")
	if code != ExitOK {
		t.Fatalf("cutover: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, w := range []string{"SUCCEEDED, port 4789 -> 4889", "commit spread:", "phases:"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("cutover output lacks %q:\n%s", w, stdout)
		}
	}
	for n, f := range fakes {
		if f.Port() != 4889 {
			t.Errorf("%s on port %d after the cutover", n, f.Port())
		}
	}
	code, stdout, _ = ctl("status", "-o", "json")
	if code != ExitOK || !strings.Contains(stdout, `"OPERATION_STATE_SUCCEEDED"`) {
		t.Errorf("status: exit %d\n%s", code, stdout)
	}

	// A failure after commit rolls back: exit 1, everyone on the old port.
	fakes["n1"].SetFault("Commit", fakeagent.Fault{After: true, Err: status.Error(codes.Unavailable, "connection reset")})
	code, stdout, stderr = ctl("cutover", "--port", "4989")
	if code != ExitFailed {
		t.Errorf("cutover with a commit failure: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for n, f := range fakes {
		if f.Port() != 4889 {
			t.Errorf("%s on port %d after a rolled-back cutover, want 4889", n, f.Port())
		}
	}
	t.Logf("rolled back:\n%s%s", stdout, stderr)
}

// serveMTLS serves c's API on a loopback port with the coordinator identity
// that `coordctl certs` made in dir (admin callers only), as production
// does; the caller stops the server.
func serveMTLS(t *testing.T, c *coordinator.Coordinator, dir string) (*grpc.Server, string) {
	t.Helper()
	scfg, err := pki.ServerConfig(pki.CoordinatorFiles(dir), pki.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	coordinator.Serve(srv, c)
	go func() { _ = srv.Serve(ln) }()
	return srv, ln.Addr().String()
}

// serveFakeAgent serves f over mTLS with node's agent certificate from dir
// (coordinators only) until the test ends, and returns its address.
func serveFakeAgent(t *testing.T, dir, node string, f *fakeagent.Agent) string {
	t.Helper()
	cfg, err := pki.ServerConfig(pki.AgentFiles(dir, node), pki.RoleCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	fakeagent.Register(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}
