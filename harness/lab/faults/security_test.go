package faults_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/pki"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// hubDial dials addr from the lab's hub namespace (where every management
// address is reachable).
func (e *env) hubDial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(lab.HubNetns(e.l.Name()), func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// callAgent makes one Info call to node's agent with creds.
func (e *env) callAgent(node string, creds credentials.TransportCredentials) error {
	n, _ := e.l.Node(node)
	conn, err := grpc.NewClient("passthrough:///"+n.AgentAddr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return e.hubDial(ctx, a) }))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	_, err = agentv1.NewAgentServiceClient(conn).Info(ctx, &agentv1.InfoRequest{})
	return err
}

// get fetches url through the hub.
func (e *env) get(url string) (int, string) {
	e.t.Helper()
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, a string) (net.Conn, error) { return e.hubDial(ctx, a) }}}
	resp, err := c.Get(url)
	if err != nil {
		e.t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// counted reads the counter family name{reason=...} from a /metrics URL.
func (e *env) counted(url, name string) map[string]int {
	re := regexp.MustCompile(`(?m)^` + name + `\{reason="([a-z_]+)"\} (\d+)`)
	_, body := e.get(url)
	out := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.Atoi(m[2])
		out[m[1]] = v
	}
	return out
}

func (e *env) rejections(node string) map[string]int {
	n, _ := e.l.Node(node)
	return e.counted("http://"+n.Metrics+"/metrics", "cutover_agent_tls_rejections_total")
}

// coordRejections are the coordinator's counts: API clients refused
// (name cutover_coordinator_tls_rejections_total) or agents refused.
func (e *env) coordRejections(name string) map[string]int {
	return e.counted("http://198.18.128.1:"+strconv.Itoa(lab.CoordinatorMetricsPort)+"/metrics", name)
}

// grew names the reasons whose count went up, comma-separated.
func grew(before, after map[string]int) string {
	var out []string
	for k, v := range after {
		if v > before[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func clientCreds(t *testing.T, f pki.Files) credentials.TransportCredentials {
	t.Helper()
	tc, err := pki.ClientConfig(f, pki.RoleAgent)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(tc)
}

// Every handshake an agent must refuse, made against the real agent binary
// in the lab, and counted in cutover_agent_tls_rejections_total{reason}.
func TestTLSRejectedAndCounted(t *testing.T) {
	e := newEnv(t, "tls")
	dir := e.l.PKIDir()
	tmp := t.TempDir()

	// Another CA altogether.
	other := filepath.Join(tmp, "other")
	if err := pki.Issue(other, pki.IssueOptions{Agents: []pki.AgentIdentity{{Name: "n1"}}, Validity: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The lab's own CA, but a certificate that expired 30 days ago.
	expired := filepath.Join(tmp, "expired")
	if err := os.MkdirAll(expired, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pki.CAFile, pki.CAKeyFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(expired, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := pki.Issue(expired, pki.IssueOptions{Agents: []pki.AgentIdentity{{Name: "n1"}}, Validity: 24 * time.Hour,
		Now: func() time.Time { return time.Now().Add(-31 * 24 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	lab3 := pki.CoordinatorFiles(dir)
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // the point: a client with no certificate

	cases := []struct {
		name   string
		creds  credentials.TransportCredentials
		reason string // counter label that must go up
	}{
		{"no client certificate", credentials.NewTLS(noCert), pki.ReasonNoCertificate},
		{"certificate from another CA", clientCreds(t, pki.Files{CA: lab3.CA, Cert: pki.CoordinatorFiles(other).Cert, Key: pki.CoordinatorFiles(other).Key}), pki.ReasonUnknownCA},
		{"expired certificate (our CA)", clientCreds(t, pki.Files{CA: lab3.CA, Cert: pki.CoordinatorFiles(expired).Cert, Key: pki.CoordinatorFiles(expired).Key}), pki.ReasonExpired},
		{"agent certificate presented as a client", clientCreds(t, pki.AgentFiles(dir, "n2")), pki.ReasonWrongRole},
		{"admin (coordctl) certificate presented to an agent", clientCreds(t, pki.AdminFiles(dir)), pki.ReasonWrongRole},
		{"plaintext to the TLS port", insecure.NewCredentials(), pki.ReasonNotTLS},
	}
	if err := e.callAgent("n1", clientCreds(t, lab3)); err != nil {
		t.Fatalf("the coordinator's own certificate is refused: %v", err)
	}
	for _, tc := range cases {
		before := e.rejections("n1")
		err := e.callAgent("n1", tc.creds)
		after := e.rejections("n1")
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		counted := grew(before, after)
		t.Logf("%s: refused (%v); counted as %q", tc.name, err, counted)
		if counted != tc.reason {
			t.Errorf("%s: counted as %q, want %q", tc.name, counted, tc.reason)
		}
		e.fact("TLS: "+tc.name, "handshake with agent n1", "refused and counted", "refused, counted as "+orNone(counted), 0)
	}

	// Roles the other way round: an agent serving the coordinator's
	// certificate is refused by the coordinator (it wants role agent).
	agentRejBefore := e.coordRejections("cutover_coordinator_agent_tls_rejections_total")
	if _, err := e.l.KillAgent("n1", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.l.StartAgent(e.ctx, "n1", "--tls-cert", lab3.Cert, "--tls-key", lab3.Key); err != nil {
		t.Fatal(err)
	}
	r := e.coordctl("agents", "-o", "json")
	t.Logf("coordctl agents with n1 serving the coordinator's certificate: exit %d (%d bytes)\n%s", r.code, len(r.out), r.out)
	if !regexp.MustCompile(`(?s)"n1".*?"error":[^\n]*(role|rejected)`).MatchString(r.stdout) {
		t.Errorf("coordctl agents does not show n1 refused for its role")
	}
	agentRej := grew(agentRejBefore, e.coordRejections("cutover_coordinator_agent_tls_rejections_total"))
	if agentRej != pki.ReasonWrongRole {
		t.Errorf("agent serving a coordinator certificate: cutover_coordinator_agent_tls_rejections_total grew for %q, want %q", agentRej, pki.ReasonWrongRole)
	}
	e.fact("TLS: agent serving a coordinator certificate", "coordinator dials n1", "coordinator refuses (role), counted",
		"refused (wrong role, shown by coordctl agents), counted as "+orNone(agentRej)+" in cutover_coordinator_agent_tls_rejections_total", 0)

	// A client without a certificate at the coordinator's API, then
	// plaintext to it: refused and counted.
	apiBefore := e.coordRejections("cutover_coordinator_tls_rejections_total")
	conn, err := grpc.NewClient("passthrough:///"+e.l.CoordinatorAddr(), grpc.WithTransportCredentials(credentials.NewTLS(noCert)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return e.hubDial(ctx, a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	if _, err := coordinatorv1.NewCoordinatorServiceClient(conn).ListAgents(ctx, &coordinatorv1.ListAgentsRequest{}); err == nil {
		t.Error("the coordinator served a client without a certificate")
	} else {
		t.Logf("coordinator, no client certificate: refused: %v", err)
	}
	apiMid := e.coordRejections("cutover_coordinator_tls_rejections_total")
	if got := grew(apiBefore, apiMid); got != pki.ReasonNoCertificate {
		t.Errorf("coordinator, no client certificate: counted as %q, want %q", got, pki.ReasonNoCertificate)
	}
	e.fact("TLS: no client certificate at the coordinator", "ListAgents", "refused, counted", "refused, counted as "+orNone(grew(apiBefore, apiMid)), 0)
	pconn, err := grpc.NewClient("passthrough:///"+e.l.CoordinatorAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return e.hubDial(ctx, a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pconn.Close() }()
	pctx, pcancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer pcancel()
	if _, err := coordinatorv1.NewCoordinatorServiceClient(pconn).ListAgents(pctx, &coordinatorv1.ListAgentsRequest{}); err == nil {
		t.Error("the coordinator served a plaintext client")
	}
	_ = pconn.Close()
	if got := grew(apiMid, e.coordRejections("cutover_coordinator_tls_rejections_total")); got != pki.ReasonNotTLS {
		t.Errorf("coordinator, plaintext: counted as %q, want %q", got, pki.ReasonNotTLS)
	}
	e.fact("TLS: plaintext gRPC to the coordinator API", "ListAgents", "refused, counted", "refused, counted as not_tls", 0)
}

func orNone(s string) string {
	if s == "" {
		return "(not counted)"
	}
	return s
}

// /metrics, /healthz and /readyz of every agent and the coordinator expose
// no key or certificate material and nothing that looks like a token.
func TestEndpointsExposeNoSecrets(t *testing.T) {
	e := newEnv(t, "sec")
	// An operation first, so every metric family has samples.
	if r := e.coordctl("cutover", "--port", "4889"); r.code != 0 {
		t.Fatalf("cutover exit %d:\n%s", r.code, r.out)
	}
	var secrets []string
	ents, _ := os.ReadDir(e.l.PKIDir())
	for _, de := range ents {
		b, _ := os.ReadFile(filepath.Join(e.l.PKIDir(), de.Name()))
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) >= 40 && !strings.HasPrefix(line, "-----") {
				secrets = append(secrets, line) // base64 body of keys and certs
			}
		}
	}
	var urls []string
	for _, n := range nodes {
		node, _ := e.l.Node(n)
		for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
			urls = append(urls, "http://"+node.Metrics+p)
		}
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		urls = append(urls, "http://198.18.128.1:"+strconv.Itoa(lab.CoordinatorMetricsPort)+p)
	}
	bad := regexp.MustCompile(`(?i)-----BEGIN|PRIVATE KEY|bearer|password|passwd|secret|token|ca-key|-key\.pem`)
	total := 0
	for _, u := range urls {
		code, body := e.get(u)
		total += len(body)
		if m := bad.FindString(body); m != "" {
			i := strings.Index(body, m)
			t.Errorf("%s (%d) contains %q: ...%s...", u, code, m, body[max(0, i-80):min(len(body), i+80)])
		}
		for _, s := range secrets {
			if strings.Contains(body, s[:40]) {
				t.Errorf("%s contains PEM material from the lab PKI", u)
			}
		}
	}
	t.Logf("scanned %d endpoints, %d bytes, against %d PEM lines", len(urls), total, len(secrets))
	e.fact("secrets in /metrics /healthz /readyz", "after a cutover", "none", "none found in "+strconv.Itoa(len(urls))+" endpoints", 0)
}
