package pki

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
)

// TestServerCredentialsCountsEarlyFailures drives ServerCredentials'
// handshake directly over a pipe: failures before the certificate check
// are counted once with their reason, certificate refusals once by the
// verifier, and neither a silent connection nor a good client is counted.
func TestServerCredentialsCountsEarlyFailures(t *testing.T) {
	dir := lab(t)
	var rec recorder
	tc := mustServer(t, AgentFiles(dir, "n1"), &rec, RoleCoordinator)
	creds := ServerCredentials(tc, rec.hook)
	serve := func(client func(c net.Conn)) error {
		t.Helper()
		s, c := net.Pipe()
		go func() {
			defer c.Close()
			client(c)
		}()
		conn, _, err := creds.ServerHandshake(s)
		if conn != nil {
			_ = conn.Close()
		}
		_ = s.Close()
		return err
	}
	tlsClient := func(cfg *tls.Config) func(net.Conn) {
		return func(c net.Conn) {
			cfg = cfg.Clone()
			cfg.NextProtos = []string{"h2"} // gRPC requires ALPN h2
			tc := tls.Client(c, cfg)
			_ = tc.Handshake()
			_, _ = tc.Read(make([]byte, 1)) // TLS 1.3: the server's verdict on our certificate comes after
		}
	}
	cases := []struct {
		name   string
		client func(net.Conn)
		want   string // reason counted, "" none
		ok     bool
	}{
		{"plaintext HTTP/2 preface", func(c net.Conn) { _, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) }, ReasonNotTLS, false},
		{"nothing sent", func(net.Conn) {}, "", false},
		{"TLS 1.2 only", tlsClient(&tls.Config{MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true}), ReasonHandshake, false},              //nolint:gosec // client side not under test
		{"no client certificate", tlsClient(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}), ReasonNoCertificate, false}, //nolint:gosec // idem
		{"client refuses our certificate", tlsClient(mustClient(t, CoordinatorFiles(dir), nil, RoleCoordinator)), "", false},
		{"good coordinator", tlsClient(mustClient(t, CoordinatorFiles(dir), nil, RoleAgent)), "", true},
	}
	for _, tc := range cases {
		before := len(rec.get())
		err := serve(tc.client)
		got := rec.get()[before:]
		if (err == nil) != tc.ok {
			t.Errorf("%s: handshake err %v, want ok=%t", tc.name, err, tc.ok)
		}
		want := []string{}
		if tc.want != "" {
			want = []string{tc.want}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: counted %q, want %q (err %v)", tc.name, got, want, err)
		}
	}
}
