// Package kubetest runs a real kube-apiserver (with a real etcd) for the
// Kubernetes test tier: discovery, node cross-checks, leader election, the
// journal in ConfigMaps, and server-side dry runs of deploy/.
//
// The apiserver is k8s.io/kubernetes v1.35.4 built from the Go module proxy
// by hack/kube-tools.sh into a per-machine cache (tools/kube pins it); etcd
// is Debian's etcd-server. Start gates on both the way harness/testenv gates
// the privileged tier: missing → skip with the command that fixes it, but
// FAIL in CI, where .ci/run builds and installs them.
//
// It owns only the processes it starts (stopped by PID in Cleanup) and the
// files under the test's directory. It listens on loopback only, and every
// address it configures is loopback or in 198.18.0.0/15 (the service range
// is ServiceClusterIPRange). It must not be imported by production code.
package kubetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Versions of the tools, as pinned in tools/kube/go.mod (a test checks they
// agree). They name the cached binaries.
const (
	KubernetesVersion = "v1.35.4"
	KustomizeVersion  = "v5.7.1"
)

// ServiceClusterIPRange is the test apiserver's service range; ServiceClusterIP
// is the address of the "kubernetes" Service in it. Both are in the
// benchmarking range 198.18.0.0/15, like every address the project uses.
const (
	ServiceClusterIPRange = "198.18.240.0/24"
	ServiceClusterIP      = "198.18.240.1"
)

// Environment variables that override where the binaries are found.
const (
	EnvAPIServer = "CUTOVER_KUBE_APISERVER"
	EnvEtcd      = "CUTOVER_ETCD"
	EnvKustomize = "CUTOVER_KUSTOMIZE"
	EnvCacheDir  = "CUTOVER_CACHE_DIR"
)

// CacheDir is where hack/kube-tools.sh puts the binaries it builds:
// $CUTOVER_CACHE_DIR, else $XDG_CACHE_HOME/cutover, else ~/.cache/cutover.
func CacheDir() string {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "cutover")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "cutover")
}

// APIServerPath is the kube-apiserver binary Start runs.
func APIServerPath() string {
	if p := os.Getenv(EnvAPIServer); p != "" {
		return p
	}
	return filepath.Join(CacheDir(), "kube-apiserver-"+KubernetesVersion)
}

// KustomizePath is the kustomize binary Kustomize runs.
func KustomizePath() string {
	if p := os.Getenv(EnvKustomize); p != "" {
		return p
	}
	return filepath.Join(CacheDir(), "kustomize-"+KustomizeVersion)
}

// EtcdPath is the etcd binary Start runs ($CUTOVER_ETCD, else etcd in PATH).
func EtcdPath() (string, error) {
	if p := os.Getenv(EnvEtcd); p != "" {
		return p, nil
	}
	return exec.LookPath("etcd")
}

// Missing says what the Kubernetes tier lacks on this machine, each with the
// command that fixes it; empty when everything is present.
func Missing() []string {
	var why []string
	if !isExecutable(APIServerPath()) {
		why = append(why, fmt.Sprintf("kube-apiserver %s is not built at %s: run hack/kube-tools.sh (builds once per machine, several minutes)", KubernetesVersion, APIServerPath()))
	}
	if _, err := EtcdPath(); err != nil {
		why = append(why, "etcd is not installed: apt-get install etcd-server (or set "+EnvEtcd+")")
	}
	return why
}

// Require skips the test (FAILS it in CI) unless kube-apiserver and etcd are
// present, and in -short mode, which runs the unit tier only.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipped in -short mode: the Kubernetes tier starts a real kube-apiserver")
	}
	if why := Missing(); len(why) > 0 {
		missing(t, strings.Join(why, "; "))
	}
}

// RequireKustomize is Require for the kustomize binary.
func RequireKustomize(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipped in -short mode: renders manifests with kustomize")
	}
	if !isExecutable(KustomizePath()) {
		missing(t, fmt.Sprintf("kustomize %s is not built at %s: run hack/kube-tools.sh kustomize", KustomizeVersion, KustomizePath()))
	}
}

func missing(t testing.TB, why string) {
	t.Helper()
	if testenv.InCI() {
		t.Fatalf("Kubernetes tier prerequisite missing in CI: %s", why)
	}
	t.Skip("skipped: " + why)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Options configure StartServer. The zero value is usable but for Dir.
type Options struct {
	// Dir holds certificates, the kubeconfig and both logs. Required.
	Dir string
	// APIServer and Etcd override the binaries (default: APIServerPath,
	// EtcdPath).
	APIServer, Etcd string
	// ExtraAPIServerArgs are appended to the apiserver's flags (later flags
	// win), e.g. "--enable-admission-plugins=...".
	ExtraAPIServerArgs []string
	// ReadyTimeout bounds the wait for /readyz (default 2 minutes: the
	// first start on a busy 2-core machine is slow).
	ReadyTimeout time.Duration
}

// Cluster is a running etcd + kube-apiserver pair.
type Cluster struct {
	// Config is an admin client config (system:masters, bypasses RBAC).
	// Copy it (rest.CopyConfig) before changing it.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same admin
	// credentials, for programs run by a test (e.g. the coordinator binary).
	Kubeconfig string
	// URL is the apiserver's https URL on 127.0.0.1.
	URL string
	// Dir is Options.Dir; etcd.log and kube-apiserver.log are in it.
	Dir string
	// StartupTime is how long StartServer took until /readyz answered ok.
	StartupTime time.Duration

	etcd, apiserver *process
	etcdData        string
}

// Start runs a fresh etcd and kube-apiserver for t, gated by Require, and
// stops both (by PID) in t.Cleanup.
func Start(t testing.TB) *Cluster {
	t.Helper()
	Require(t)
	c, err := StartServer(context.Background(), Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("kubetest: stop: %v", err)
		}
	})
	t.Logf("kubetest: kube-apiserver %s ready at %s in %v (logs in %s)", KubernetesVersion, c.URL, c.StartupTime.Round(time.Millisecond), c.Dir)
	return c
}

// StartServer runs etcd and kube-apiserver on free loopback ports and waits
// until the apiserver's /readyz answers ok. The caller must call Stop.
func StartServer(ctx context.Context, o Options) (*Cluster, error) {
	if o.Dir == "" {
		return nil, errors.New("kubetest: Options.Dir: empty: name a directory for certificates and logs")
	}
	if o.APIServer == "" {
		o.APIServer = APIServerPath()
	}
	if o.Etcd == "" {
		p, err := EtcdPath()
		if err != nil {
			return nil, fmt.Errorf("kubetest: etcd: %w (apt-get install etcd-server)", err)
		}
		o.Etcd = p
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	// A free port picked by binding :0 can be taken by someone else before
	// the server binds it; the server then exits at once, and a retry with
	// new ports fixes it.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := start(ctx, o)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !errors.Is(err, errExitedEarly) {
			break
		}
	}
	return nil, lastErr
}

var errExitedEarly = errors.New("exited before becoming ready")

func start(ctx context.Context, o Options) (c *Cluster, err error) {
	begin := time.Now()
	c = &Cluster{Dir: o.Dir}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	p, files, err := newPKI(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("kubetest: certificates: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientPort, peerPort, apiPort := ports[0], ports[1], ports[2]

	// etcd fsyncs every write; on tmpfs that is free, which is most of the
	// apiserver's start-up time on a slow disk.
	c.etcdData, err = os.MkdirTemp(shmOr(o.Dir), "cutover-kubetest-etcd-")
	if err != nil {
		return nil, fmt.Errorf("kubetest: etcd data dir: %w", err)
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd, err = startProcess(filepath.Join(o.Dir, "etcd.log"), o.Etcd,
		"--name=kubetest",
		"--data-dir="+c.etcdData,
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	c.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		// Without it the apiserver advertises the default route's address.
		"--advertise-address=127.0.0.1",
		// No kubernetes Endpoints for 127.0.0.1 (loopback is invalid there).
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--cert-dir=" + filepath.Join(o.Dir, "apiserver-certs"),
		"--client-ca-file=" + files.ca,
		"--tls-cert-file=" + files.serverCert,
		"--tls-private-key-file=" + files.serverKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + files.saPub,
		"--service-account-signing-key-file=" + files.saKey,
		// RBAC, so tests can check the deploy/ roles by impersonating the
		// service accounts; the admin is system:masters.
		"--authorization-mode=RBAC",
		// The agent DaemonSet is privileged; without this it is invalid.
		"--allow-privileged=true",
		// No controller-manager creates the "default" ServiceAccounts, and
		// this admission plugin would reject every pod without one.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
	args = append(args, o.ExtraAPIServerArgs...)
	c.apiserver, err = startProcess(filepath.Join(o.Dir, "kube-apiserver.log"), o.APIServer, args...)
	if err != nil {
		return nil, err
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	cert, err := tls.X509KeyPair(p.adminCertPEM, p.adminKeyPEM)
	if err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, pool, cert, o.ReadyTimeout); err != nil {
		return nil, err
	}
	c.Config = &rest.Config{
		Host: c.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   p.caPEM,
			CertData: p.adminCertPEM,
			KeyData:  p.adminKeyPEM,
		},
		// Tests create objects in bursts; the default 5 QPS would make
		// them slow, not more realistic.
		QPS:       200,
		Burst:     400,
		UserAgent: "cutover-kubetest",
	}
	c.Kubeconfig = filepath.Join(o.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kubeconfig(c.URL, p), 0o600); err != nil {
		return nil, fmt.Errorf("kubetest: write kubeconfig: %w", err)
	}
	c.StartupTime = time.Since(begin)
	return c, nil
}

func (c *Cluster) waitReady(ctx context.Context, pool *x509.CertPool, cert tls.Certificate, timeout time.Duration) error {
	hc := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs:      pool,
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
		}},
	}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		for _, p := range []*process{c.etcd, c.apiserver} {
			if p.exited() {
				werr := p.waitErr
				if werr == nil {
					werr = errors.New("exit status 0")
				}
				return fmt.Errorf("kubetest: %s %w: %w\n%s", filepath.Base(p.path), errExitedEarly, werr, p.logTail())
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, lastLines(body.String(), 10))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubetest: kube-apiserver not ready after %v (last /readyz: %s)\n%s", timeout, last, c.apiserver.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the apiserver and then etcd, by PID (SIGTERM, then SIGKILL
// after a grace period), and removes etcd's data. Safe to call twice.
func (c *Cluster) Stop() error {
	var errs []error
	for _, p := range []*process{c.apiserver, c.etcd} {
		if p != nil {
			errs = append(errs, p.stop(10*time.Second))
		}
	}
	if c.etcdData != "" {
		errs = append(errs, os.RemoveAll(c.etcdData))
		c.etcdData = ""
	}
	return errors.Join(errs...)
}

// Clientset is a typed client with the admin credentials.
func (c *Cluster) Clientset() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(c.Config)
}

// Impersonate returns a copy of the admin config that acts as user in
// groups, so a test can check what RBAC lets that identity do.
func (c *Cluster) Impersonate(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// ServiceAccount returns a config acting as the service account
// namespace/name, with the groups the apiserver gives real SA tokens.
func (c *Cluster) ServiceAccount(namespace, name string) *rest.Config {
	return c.Impersonate("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

func kubeconfig(url string, p *pki) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: kubetest
  context:
    cluster: kubetest
    user: admin
current-context: kubetest
`, url, b64(p.caPEM), b64(p.adminCertPEM), b64(p.adminKeyPEM)))
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubetest: pick a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func shmOr(dir string) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", ".cutover-probe-"); err == nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return dir
}

// process is one child started by this package, tracked by PID.
type process struct {
	path, log string
	cmd       *exec.Cmd
	done      chan struct{}
	waitErr   error
}

func startProcess(logPath, path string, args ...string) (*process, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without running Cleanup, the kernel kills the
	// child instead of leaving an orphan apiserver holding ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("kubetest: start %s: %w", path, err)
	}
	p := &process{path: path, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kubetest: SIGTERM pid %d (%s): %w", p.cmd.Process.Pid, p.path, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kubetest: SIGKILL pid %d (%s): %w", p.cmd.Process.Pid, p.path, err)
	}
	<-p.done
	return nil
}

func (p *process) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return "--- last lines of " + p.log + " ---\n" + lastLines(string(b), 40)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
