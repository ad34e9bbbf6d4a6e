package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lab issues a PKI with agents n1 and n2 into a fresh temp dir.
func lab(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	err := Issue(dir, IssueOptions{
		Agents:   []AgentIdentity{{Name: "n1", IPs: []net.IP{net.ParseIP("198.18.0.1")}}, {Name: "n2"}},
		Validity: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// recorder collects onReject reasons.
type recorder struct {
	mu      sync.Mutex
	reasons []string
}

func (r *recorder) hook(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons = append(r.reasons, reason)
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reasons...)
}

// handshake runs a full TLS handshake plus one server→client byte over a
// pipe, so that a client certificate rejected after the client's side of a
// TLS 1.3 handshake completed still surfaces on the client.
func handshake(t *testing.T, srv, cli *tls.Config) (srvState tls.ConnectionState, srvErr, cliErr error) {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Close the pipe, not the tls.Conn: a close_notify written into a
		// synchronous pipe nobody reads would block until the deadline.
		defer func() { _ = a.Close() }()
		s := tls.Server(a, srv)
		_ = a.SetDeadline(time.Now().Add(5 * time.Second))
		if srvErr = s.Handshake(); srvErr != nil {
			return
		}
		srvState = s.ConnectionState()
		_, srvErr = s.Write([]byte{1})
	}()
	c := tls.Client(b, cli)
	_ = b.SetDeadline(time.Now().Add(5 * time.Second))
	cliErr = c.Handshake()
	if cliErr == nil {
		_, cliErr = io.ReadFull(c, make([]byte, 1))
	}
	_ = b.Close()
	<-done
	return srvState, srvErr, cliErr
}

func mustServer(t *testing.T, f Files, rec *recorder, roles ...string) *tls.Config {
	t.Helper()
	var hook func(string)
	if rec != nil {
		hook = rec.hook
	}
	c, err := ServerConfigWithHook(f, hook, roles...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustClient(t *testing.T, f Files, rec *recorder, role string) *tls.Config {
	t.Helper()
	var hook func(string)
	if rec != nil {
		hook = rec.hook
	}
	c, err := ClientConfigWithHook(f, hook, role)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHandshakeAccepted(t *testing.T) {
	dir := lab(t)
	for _, tc := range []struct {
		name       string
		server     Files
		allowed    []string
		client     Files
		serverRole string
		wantPeer   string
	}{
		{"coordinator→agent", AgentFiles(dir, "n1"), []string{RoleCoordinator}, CoordinatorFiles(dir), RoleAgent, RoleCoordinator},
		{"admin→coordinator", CoordinatorFiles(dir), []string{RoleAdmin}, AdminFiles(dir), RoleCoordinator, RoleAdmin},
		{"agent→agent (probe mesh)", AgentFiles(dir, "n2"), []string{RoleCoordinator, RoleAgent}, AgentFiles(dir, "n1"), RoleAgent, RoleAgent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			st, srvErr, cliErr := handshake(t, mustServer(t, tc.server, &rec, tc.allowed...), mustClient(t, tc.client, &rec, tc.serverRole))
			if srvErr != nil || cliErr != nil {
				t.Fatalf("server: %v; client: %v", srvErr, cliErr)
			}
			if len(st.PeerCertificates) == 0 {
				t.Fatal("server saw no client certificate")
			}
			if role, err := RoleOf(st.PeerCertificates[0]); err != nil || role != tc.wantPeer {
				t.Fatalf("peer role = %q, %v; want %q", role, err, tc.wantPeer)
			}
			if r := rec.get(); len(r) != 0 {
				t.Fatalf("rejections recorded on success: %v", r)
			}
		})
	}
}

// TestHandshakeOverLoopback runs one handshake through the kernel's TCP
// stack on 127.0.0.1, as the binaries do.
func TestHandshakeOverLoopback(t *testing.T) {
	dir := lab(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", mustServer(t, AgentFiles(dir, "n1"), nil, RoleCoordinator))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("ok"))
		_ = c.Close()
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), mustClient(t, CoordinatorFiles(dir), nil, RoleAgent))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestHandshakeRejected(t *testing.T) {
	dir := lab(t)
	other := lab(t) // a second, unrelated CA

	// Leaves that Issue would never produce, signed by dir's CA.
	ca, err := loadCA(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	expired := writeLeaf(t, ca, leafSpec{cn: "old", role: RoleCoordinator, server: true, client: true}, time.Now().Add(-48*time.Hour), time.Hour)
	roleless := writeLeaf(t, ca, leafSpec{cn: "nobody", server: true, client: true}, time.Now(), time.Hour)

	type mk func(*recorder) *tls.Config
	srv := func(f Files, roles ...string) mk {
		return func(r *recorder) *tls.Config { return mustServer(t, f, r, roles...) }
	}
	cli := func(f Files, role string) mk {
		return func(r *recorder) *tls.Config { return mustClient(t, f, r, role) }
	}
	caOf := func(f Files) Files { f.CA = filepath.Join(dir, CAFile); return f }
	noCert := func(r *recorder) *tls.Config {
		c := mustClient(t, CoordinatorFiles(dir), r, RoleAgent)
		c.Certificates, c.GetClientCertificate = nil, nil
		return c
	}

	for _, tc := range []struct {
		name       string
		srv, cli   mk
		rejectedBy string // "server" or "client"
		reason     string
		msg        string
	}{
		{"no client certificate",
			srv(AgentFiles(dir, "n1"), RoleCoordinator), noCert,
			"server", ReasonNoCertificate, "no certificate presented"},
		{"client from another CA",
			srv(AgentFiles(dir, "n1"), RoleCoordinator), cli(caOf(CoordinatorFiles(other)), RoleAgent),
			"server", ReasonUnknownCA, "not issued by the configured CA"},
		{"server from another CA",
			srv(caOf(AgentFiles(other, "n1")), RoleCoordinator), cli(CoordinatorFiles(dir), RoleAgent),
			"client", ReasonUnknownCA, "not issued by the configured CA"},
		{"expired client",
			srv(AgentFiles(dir, "n1"), RoleCoordinator), cli(caOf(expired), RoleAgent),
			"server", ReasonExpired, "expired"},
		{"expired server",
			srv(caOf(expired), RoleAdmin), cli(AdminFiles(dir), RoleCoordinator),
			"client", ReasonExpired, "expired"},
		{"agent cert as client of an agent that only allows coordinator",
			srv(AgentFiles(dir, "n1"), RoleCoordinator), cli(AgentFiles(dir, "n2"), RoleAgent),
			"server", ReasonWrongRole, `role "agent" not allowed here, want coordinator`},
		{"coordinator cert presented by a server where the client wants agent",
			srv(CoordinatorFiles(dir), RoleCoordinator), cli(CoordinatorFiles(dir), RoleAgent),
			"client", ReasonWrongRole, `role "coordinator" not allowed here, want agent`},
		{"admin cert (clientAuth only) used as a server",
			srv(AdminFiles(dir), RoleCoordinator), cli(CoordinatorFiles(dir), RoleAdmin),
			"client", ReasonWrongUsage, "usage"},
		{"certificate without a role",
			srv(AgentFiles(dir, "n1"), RoleCoordinator), cli(caOf(roleless), RoleAgent),
			"server", ReasonNoRole, "no role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Both sides get the hook: only the side that rejects may call it.
			var rec recorder
			_, srvErr, cliErr := handshake(t, tc.srv(&rec), tc.cli(&rec))
			if srvErr == nil || cliErr == nil {
				t.Fatalf("want both sides to fail; server: %v; client: %v", srvErr, cliErr)
			}
			local := srvErr
			if tc.rejectedBy == "client" {
				local = cliErr
			}
			if got := ReasonOf(local); got != tc.reason {
				t.Errorf("ReasonOf(%v) = %q, want %q", local, got, tc.reason)
			}
			if !strings.Contains(local.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", local, tc.msg)
			}
			if got := rec.get(); len(got) != 1 || got[0] != tc.reason {
				t.Errorf("onReject calls = %v, want [%s]", got, tc.reason)
			}
		})
	}
}

func TestRejectHook(t *testing.T) {
	dir, other := lab(t), lab(t)
	var rec recorder
	srv := mustServer(t, AgentFiles(dir, "n1"), &rec, RoleCoordinator)
	for _, cli := range []*tls.Config{
		mustClient(t, AgentFiles(dir, "n2"), nil, RoleAgent), // wrong role
		mustClient(t, Files{CA: filepath.Join(dir, CAFile), Cert: CoordinatorFiles(other).Cert, Key: CoordinatorFiles(other).Key}, nil, RoleAgent), // other CA
		mustClient(t, CoordinatorFiles(dir), nil, RoleAgent), // good
	} {
		handshake(t, srv, cli)
	}
	if got, want := strings.Join(rec.get(), ","), ReasonWrongRole+","+ReasonUnknownCA; got != want {
		t.Fatalf("server hook reasons = %s, want %s", got, want)
	}
	var crec recorder
	handshake(t, mustServer(t, CoordinatorFiles(dir), nil, RoleCoordinator), mustClient(t, CoordinatorFiles(dir), &crec, RoleAgent))
	if got := crec.get(); len(got) != 1 || got[0] != ReasonWrongRole {
		t.Fatalf("client hook reasons = %v", got)
	}
}

func writeLeaf(t *testing.T, ca *authority, s leafSpec, now time.Time, validity time.Duration) Files {
	t.Helper()
	c, k, err := ca.issue(s, now, validity)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := Files{Cert: filepath.Join(dir, s.cn+".pem"), Key: filepath.Join(dir, s.cn+"-key.pem")}
	if err := os.WriteFile(f.Cert, c, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssueContents(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	err := Issue(dir, IssueOptions{
		Agents:         []AgentIdentity{{Name: "node-a", IPs: []net.IP{net.ParseIP("198.18.0.10")}}},
		CoordinatorIPs: []net.IP{net.ParseIP("198.18.0.1")},
		Validity:       24 * time.Hour,
		Now:            func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	ag := readCert(t, AgentFiles(dir, "node-a").Cert)
	if r, _ := RoleOf(ag); r != RoleAgent {
		t.Errorf("agent role %q", r)
	}
	if got := ag.DNSNames; len(got) != 1 || got[0] != "node-a" {
		t.Errorf("agent DNS SANs %v", got)
	}
	if got := ipStrings(ag.IPAddresses); got != "127.0.0.1,198.18.0.10" {
		t.Errorf("agent IP SANs %s", got)
	}
	if !ag.NotAfter.Equal(now.Add(24 * time.Hour)) {
		t.Errorf("agent NotAfter %s", ag.NotAfter)
	}
	if len(ag.ExtKeyUsage) != 2 {
		t.Errorf("agent EKU %v", ag.ExtKeyUsage)
	}
	co := readCert(t, CoordinatorFiles(dir).Cert)
	if r, _ := RoleOf(co); r != RoleCoordinator {
		t.Errorf("coordinator role %q", r)
	}
	if got := ipStrings(co.IPAddresses); got != "127.0.0.1,198.18.0.1" {
		t.Errorf("coordinator IP SANs %s", got)
	}
	ad := readCert(t, AdminFiles(dir).Cert)
	if r, _ := RoleOf(ad); r != RoleAdmin || len(ad.ExtKeyUsage) != 1 || ad.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("admin role %q EKU %v", r, ad.ExtKeyUsage)
	}
	for _, f := range []string{CAKeyFile, "coordinator-key.pem", "admin-key.pem", "agent-node-a-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}

	// A second run reuses the CA and adds an agent that chains to it.
	caBefore, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if err := Issue(dir, IssueOptions{Agents: []AgentIdentity{{Name: "node-b"}}, Validity: time.Hour, Now: func() time.Time { return now }}); err != nil {
		t.Fatal(err)
	}
	caAfter, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if string(caBefore) != string(caAfter) {
		t.Fatal("second Issue replaced the CA")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caAfter)
	nb := readCert(t, AgentFiles(dir, "node-b").Cert)
	if _, err := nb.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("node-b does not chain to the reused CA: %v", err)
	}
}

func ipStrings(ips []net.IP) string {
	var s []string
	for _, ip := range ips {
		s = append(s, ip.String())
	}
	return strings.Join(s, ",")
}

func TestIssueBadInput(t *testing.T) {
	for _, tc := range []struct {
		o    IssueOptions
		want string
	}{
		{IssueOptions{}, "validity 0s: must be positive"},
		{IssueOptions{Validity: time.Hour, Agents: []AgentIdentity{{Name: ""}}}, "agents[0]: empty name"},
		{IssueOptions{Validity: time.Hour, Agents: []AgentIdentity{{Name: "Bad_Name"}}}, `agent name "Bad_Name": not a DNS-1123 subdomain`},
		{IssueOptions{Validity: time.Hour, Agents: []AgentIdentity{{Name: "a"}, {Name: "a"}}}, `agent name "a": given twice`},
		{IssueOptions{Validity: time.Hour, Agents: []AgentIdentity{{Name: "a", IPs: []net.IP{net.IPv4zero}}}}, `agent "a": IP 0.0.0.0 is not a usable address`},
	} {
		dir := filepath.Join(t.TempDir(), "pki")
		err := Issue(dir, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Issue(%+v) = %v, want %q", tc.o, err, tc.want)
		}
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("bad input created %s", dir)
		}
	}
}

func TestFilesValidate(t *testing.T) {
	dir := lab(t)
	if err := CoordinatorFiles(dir).Validate(); err != nil {
		t.Fatal(err)
	}
	err := Files{CA: filepath.Join(dir, "missing.pem"), Key: CoordinatorFiles(dir).Key}.Validate()
	for _, want := range []string{`--tls-ca "` + filepath.Join(dir, "missing.pem") + `": cannot read`, "--tls-cert: no file given"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to contain %q", err, want)
		}
	}
	if _, err := ServerConfig(Files{CA: CoordinatorFiles(dir).Cert + ".nope", Cert: CoordinatorFiles(dir).Cert, Key: CoordinatorFiles(dir).Key}, RoleAdmin); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("ServerConfig with missing CA: %v", err)
	}
	if _, err := ServerConfig(CoordinatorFiles(dir)); err == nil || !strings.Contains(err.Error(), "no allowed peer role") {
		t.Errorf("ServerConfig with no roles: %v", err)
	}
	if _, err := ClientConfig(CoordinatorFiles(dir), "root"); err == nil || !strings.Contains(err.Error(), `role "root" unknown`) {
		t.Errorf("ClientConfig with bad role: %v", err)
	}
	// A key that does not match the certificate.
	bad := Files{CA: CoordinatorFiles(dir).CA, Cert: CoordinatorFiles(dir).Cert, Key: AdminFiles(dir).Key}
	if _, err := ClientConfig(bad, RoleAgent); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("mismatched key: %v", err)
	}
}

func TestRoleOf(t *testing.T) {
	c := &x509.Certificate{}
	if _, err := RoleOf(c); err == nil || !strings.Contains(err.Error(), "no role") {
		t.Errorf("no URIs: %v", err)
	}
	c.URIs = append(c.URIs, RoleURI(RoleAgent), RoleURI(RoleAdmin))
	if _, err := RoleOf(c); err == nil || !strings.Contains(err.Error(), "ambiguous role") {
		t.Errorf("two roles: %v", err)
	}
	c.URIs = c.URIs[:1]
	if r, err := RoleOf(c); err != nil || r != RoleAgent {
		t.Errorf("RoleOf = %q, %v", r, err)
	}
	c.URIs[0] = RoleURI("root")
	if _, err := RoleOf(c); err == nil || !strings.Contains(err.Error(), `unknown role "root"`) {
		t.Errorf("unknown role: %v", err)
	}
}
