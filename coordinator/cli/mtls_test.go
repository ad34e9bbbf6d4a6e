package cli

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/cutover-dev/cutover/pkg/pki"
)

// closedPort returns an address on 127.0.0.1 where nothing listens.
func closedPort(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return ln, addr
}

// certsDir runs `coordctl certs` itself, so the command is tested too.
func certsDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	code, stdout, stderr := run(t, "certs", "--dir", dir, "--agent", "n1=198.18.0.1,n2=198.18.0.2", "--coordinator-ip", "198.18.0.100", "--validity", "1h")
	if code != 0 {
		t.Fatalf("certs: exit %d: %s", code, stderr)
	}
	for _, f := range []string{"ca.pem", "coordinator.pem", "admin-key.pem", "agent-n1.pem", "agent-n2-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("certs did not write %s: %v", f, err)
		}
		if !strings.Contains(stdout, dir) {
			t.Errorf("certs output does not name %s:\n%s", dir, stdout)
		}
	}
	return dir
}

// mtlsServer serves f with the coordinator identity of dir, accepting only
// admin clients, and records rejection reasons.
func mtlsServer(t *testing.T, f *fakeCoord, dir string) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var reasons []string
	cfg, err := pki.ServerConfigWithHook(pki.CoordinatorFiles(dir), func(r string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, r)
	}, pki.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, f, credentials.NewTLS(cfg))
	return addr, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), reasons...)
	}
}

func TestMTLS(t *testing.T) {
	dir := certsDir(t)
	other := certsDir(t) // an unrelated CA
	f := &fakeCoord{agents: sampleAgents()}
	addr, rejected := mtlsServer(t, f, dir)

	code, stdout, stderr := run(t, "--coordinator", addr, "--tls-dir", dir, "agents")
	if code != ExitOK || !strings.Contains(stdout, "198.18.0.1:9443") {
		t.Fatalf("agents over mTLS: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if strings.Contains(stderr, "WARNING") {
		t.Errorf("warning without --insecure: %s", stderr)
	}

	// Explicit files work as well as --tls-dir.
	a := pki.AdminFiles(dir)
	if code, _, stderr = run(t, "--coordinator", addr, "--tls-ca", a.CA, "--tls-cert", a.Cert, "--tls-key", a.Key, "agents"); code != ExitOK {
		t.Fatalf("agents with --tls-ca/--tls-cert/--tls-key: exit %d: %s", code, stderr)
	}

	// --tls-dir also reads a Kubernetes TLS Secret's layout
	// (cert-manager's cutover-admin-tls saved or mounted as files).
	sec := t.TempDir()
	for from, to := range map[string]string{a.CA: "ca.crt", a.Cert: "tls.crt", a.Key: "tls.key"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sec, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr = run(t, "--coordinator", addr, "--tls-dir", sec, "agents"); code != ExitOK {
		t.Fatalf("agents with --tls-dir holding ca.crt, tls.crt, tls.key: exit %d: %s", code, stderr)
	}
	if code, _, stderr = run(t, "--coordinator", addr, "--tls-dir", t.TempDir(), "agents"); code != ExitUsage || !strings.Contains(stderr, "neither admin.pem") {
		t.Errorf("--tls-dir of an empty directory: exit %d: %s", code, stderr)
	}

	// A client certificate from another CA: the coordinator rejects it.
	oa := pki.AdminFiles(other)
	code, _, stderr = run(t, "--coordinator", addr, "--tls-ca", a.CA, "--tls-cert", oa.Cert, "--tls-key", oa.Key, "agents")
	t.Logf("client cert from another CA: %s", stderr)
	if code != ExitUnreachable {
		t.Errorf("client cert from another CA: exit %d, want %d: %s", code, ExitUnreachable, stderr)
	}
	for _, w := range []string{"TLS with coordinator " + addr + " failed", "the coordinator rejected coordctl's certificate"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q: %s", w, stderr)
		}
	}
	// At least once: after a rejection coordctl makes one bare handshake to
	// learn the coordinator's alert, which the server counts as well.
	if got := rejected(); len(got) == 0 || strings.Trim(strings.ReplaceAll(strings.Join(got, ","), pki.ReasonUnknownCA, ""), ",") != "" {
		t.Errorf("server rejections %v, want only %s", got, pki.ReasonUnknownCA)
	}
	before := len(rejected())

	// coordctl trusting another CA rejects the coordinator itself.
	code, _, stderr = run(t, "--coordinator", addr, "--tls-dir", other, "agents")
	t.Logf("server from another CA: %s", stderr)
	if code != ExitUnreachable || !strings.Contains(stderr, "not issued by the configured CA") || !strings.Contains(stderr, "coordctl rejected the coordinator's certificate") {
		t.Errorf("server from another CA: exit %d: %s", code, stderr)
	}

	// An agent certificate is not an admin one.
	ag := pki.AgentFiles(dir, "n1")
	if code, _, stderr = run(t, "--coordinator", addr, "--tls-ca", ag.CA, "--tls-cert", ag.Cert, "--tls-key", ag.Key, "agents"); code != ExitUnreachable {
		t.Errorf("agent cert as coordctl: exit %d: %s", code, stderr)
	}
	if got := rejected()[before:]; len(got) == 0 || got[0] != pki.ReasonWrongRole {
		t.Errorf("server rejections %v, want wrong_role", got)
	}
	if c := f.Calls(); c != "ListAgents,ListAgents,ListAgents" {
		t.Errorf("calls that reached the service: %s", c)
	}
}

func TestAddCommand(t *testing.T) {
	saved := extensions
	t.Cleanup(func() { extensions = saved })
	AddCommand(func(root *cobra.Command, g *Globals) {
		root.AddCommand(&cobra.Command{Use: "ext", RunE: func(*cobra.Command, []string) error {
			_, _ = g.Stdout.Write([]byte("ext " + g.Output + "\n"))
			return Exitf(ExitProblems, "ext: nothing up")
		}})
	})
	code, stdout, stderr := run(t, "ext", "-o", "json")
	if code != ExitProblems || stdout != "ext json\n" || !strings.Contains(stderr, "ext: nothing up") {
		t.Errorf("exit %d %q %q", code, stdout, stderr)
	}
}
