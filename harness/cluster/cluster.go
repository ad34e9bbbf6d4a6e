package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/pkg/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Addresses. Everything is inside 198.18.0.0/15 (the benchmarking range):
// the hub bridge and the nodes' addresses in NodeNet, Services in
// kubetest.ServiceClusterIPRange, pod subnets in PodCIDR.
var (
	NodeNet  = netip.MustParsePrefix("198.18.192.0/24")
	HubIP    = netip.MustParseAddr("198.18.192.1")
	PodCIDR  = netip.MustParsePrefix("198.19.0.0/16")
	firstIP  = 11 // node i (1-based) is 198.18.192.(10+i)
	apiPort  = 6443
	stopWait = 15 * time.Second
)

// NodeIP is node i's (1-based) address on the hub bridge.
func NodeIP(i int) netip.Addr {
	b := HubIP.As4()
	b[3] = byte(firstIP - 1 + i)
	return netip.AddrFrom4(b)
}

// NodeSubnet is node i's pod subnet (1-based): 198.19.i.0/24.
func NodeSubnet(i int) netip.Prefix {
	b := PodCIDR.Addr().As4()
	b[2] = byte(i)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// Config says what cluster to run.
type Config struct {
	// Name prefixes the namespaces (Name-hub, Name-n1, ...) and cgroups;
	// default "cotc". Up removes leftovers of an earlier run of the same
	// name first.
	Name string
	// Dir holds everything the cluster writes (required). Node state that
	// needs unix sockets lives under /run/Name instead: socket paths are
	// limited to 108 bytes.
	Dir string
	// Nodes is the number of kubelets (default 3).
	Nodes int
	// Images are image tarballs imported into every node's containerd
	// before its kubelet starts (there is no registry).
	Images []string
	// PauseImage is the sandbox image's reference; it must be in Images.
	PauseImage string
	// OVSPort, when set, gives every node the OVS overlay (ovs.go) on
	// this VXLAN port, built before its kubelet starts.
	OVSPort int
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
}

func (c *Config) defaults() error {
	if c.Name == "" {
		c.Name = "cotc"
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Dir == "" {
		return errors.New("cluster: Config.Dir: empty: name a directory for the cluster's files")
	}
	if c.Nodes < 1 || c.Nodes > 16 {
		return fmt.Errorf("cluster: Config.Nodes: %d: want 1 to 16", c.Nodes)
	}
	if c.PauseImage == "" {
		return errors.New("cluster: Config.PauseImage: empty: name the sandbox image (imported from Config.Images)")
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// Cluster is a running control plane and its nodes.
type Cluster struct {
	cfg Config
	pki *pki
	// Hub is the control plane's network namespace; Go clients reach the
	// apiserver through it (Config's Dial), CLIs run in it (Command).
	Hub string
	// Kubeconfig is an admin (system:masters) kubeconfig for
	// https://HubIP:6443, usable inside Hub.
	Kubeconfig string
	// Nodes, in order n1, n2, ...
	Nodes []*Node
	// StartupTime is how long Up took until every node was Ready.
	StartupTime time.Duration

	mu                              sync.Mutex
	etcd, apiserver, kcm, scheduler *proc
	etcdData                        string
}

// Up starts the cluster and returns once every node is Ready. On error it
// stops whatever it started.
func Up(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	begin := time.Now()
	if err := Teardown(cfg.Name); err != nil {
		return nil, fmt.Errorf("cluster: leftovers of an earlier %q: %w", cfg.Name, err)
	}
	cl := &Cluster{cfg: cfg, Hub: cfg.Name + "-hub"}
	// A failed Up stops what it started; the named results are set by the
	// time this runs, so it holds its own reference.
	defer func() {
		if err != nil {
			err = errors.Join(err, cl.Down())
			c = nil
		}
	}()
	c = cl
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if c.pki, err = newPKI(filepath.Join(cfg.Dir, "pki")); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}
	if err := c.hubNetwork(); err != nil {
		return nil, err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	cfg.Logf("cluster: control plane ready after %v", time.Since(begin).Round(time.Millisecond))
	c.Nodes = make([]*Node, cfg.Nodes)
	errs := make([]error, cfg.Nodes)
	var wg sync.WaitGroup
	for i := range c.Nodes {
		c.Nodes[i] = &Node{c: c, Index: i + 1, Name: fmt.Sprintf("n%d", i+1)}
		wg.Add(1)
		go func(n *Node) {
			defer wg.Done()
			errs[n.Index-1] = n.start(ctx)
		}(c.Nodes[i])
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := c.waitNodesReady(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	c.StartupTime = time.Since(begin)
	cfg.Logf("cluster: %d node(s) Ready after %v", cfg.Nodes, c.StartupTime.Round(time.Millisecond))
	return c, nil
}

// hubNetwork makes the hub namespace and its bridge.
func (c *Cluster) hubNetwork() error {
	if err := netns.Create(c.Hub); err != nil {
		return err
	}
	return ipBatch(c.Hub,
		"link add br-cl type bridge mcast_snooping 0",
		"addr add "+netip.PrefixFrom(HubIP, NodeNet.Bits()).String()+" dev br-cl",
		"link set br-cl up",
		// Nothing the cluster does leaves the machine: no route but its own.
		"route add blackhole default",
	)
}

func (c *Cluster) apiURL() string { return fmt.Sprintf("https://%s:%d", HubIP, apiPort) }

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.pki
	dir := c.cfg.Dir
	kv := kubetest.KubernetesVersion
	bin := func(n string) string { return filepath.Join(kubetest.CacheDir(), n+"-"+kv) }
	etcdBin, err := kubetest.EtcdPath()
	if err != nil {
		return fmt.Errorf("cluster: etcd: %w (apt-get install etcd-server)", err)
	}
	// etcd fsyncs every write: on tmpfs that costs nothing.
	if c.etcdData, err = os.MkdirTemp("/dev/shm", c.cfg.Name+"-etcd-"); err != nil {
		return err
	}
	inHub := func(argv ...string) []string {
		return append([]string{"nsenter", "--net=" + filepath.Join(netns.Dir, c.Hub), "--"}, argv...)
	}
	c.etcd, err = start("etcd", filepath.Join(dir, "etcd.log"), nil, inHub(etcdBin,
		"--name=cluster", "--data-dir="+c.etcdData,
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=cluster=http://127.0.0.1:2380", "--initial-cluster-state=new",
		"--logger=zap", "--log-level=warn")...)
	if err != nil {
		return err
	}
	ips := []net.IP{net.IP(HubIP.AsSlice()), net.ParseIP(kubetest.ServiceClusterIP), net.IPv4(127, 0, 0, 1)}
	srvCrt, srvKey, err := p.leaf("apiserver", "kube-apiserver", nil, true, ips,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	// The apiserver's identity towards kubelets (logs, exec, port-forward);
	// the kubelets' Webhook authorizer asks the apiserver, and
	// system:masters may do anything.
	klCrt, klKey, err := p.leaf("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path("ca.key"), pemECKey(p.caKey), 0o600); err != nil {
		return err
	}
	c.apiserver, err = start("kube-apiserver", filepath.Join(dir, "kube-apiserver.log"), nil, inHub(bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", apiPort),
		"--advertise-address="+HubIP.String(),
		"--service-cluster-ip-range="+kubetest.ServiceClusterIPRange,
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--client-ca-file="+p.caFile(),
		"--tls-cert-file="+srvCrt, "--tls-private-key-file="+srvKey,
		"--kubelet-client-certificate="+klCrt, "--kubelet-client-key="+klKey,
		// Nodes register by name; there is no DNS for them.
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p.path("sa.pub"),
		"--service-account-signing-key-file="+p.path("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1")...)
	if err != nil {
		return err
	}
	if c.Kubeconfig, err = p.kubeconfig("admin", "cutover-cluster-admin", []string{"system:masters"}, c.apiURL()); err != nil {
		return err
	}
	if err := c.waitAPIServer(ctx, 3*time.Minute); err != nil {
		return err
	}
	kcmCfg, err := p.kubeconfig("kube-controller-manager", "system:kube-controller-manager", nil, c.apiURL())
	if err != nil {
		return err
	}
	c.kcm, err = start("kube-controller-manager", filepath.Join(dir, "kube-controller-manager.log"), nil, inHub(bin("kube-controller-manager"),
		"--kubeconfig="+kcmCfg,
		"--authentication-kubeconfig="+kcmCfg, "--authorization-kubeconfig="+kcmCfg,
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+p.path("sa.key"),
		"--root-ca-file="+p.caFile(),
		"--cluster-signing-cert-file="+p.caFile(), "--cluster-signing-key-file="+p.path("ca.key"),
		// Node pod subnets for a CNI that reads them (flannel's kube
		// subnet manager): 198.19.0.0/16 cut into /24s.
		"--allocate-node-cidrs=true", "--cluster-cidr="+PodCIDR.String(), "--node-cidr-mask-size=24",
		"--service-cluster-ip-range="+kubetest.ServiceClusterIPRange,
		"--bind-address=127.0.0.1",
		"--v=1")...)
	if err != nil {
		return err
	}
	schedCfg, err := p.kubeconfig("kube-scheduler", "system:kube-scheduler", nil, c.apiURL())
	if err != nil {
		return err
	}
	c.scheduler, err = start("kube-scheduler", filepath.Join(dir, "kube-scheduler.log"), nil, inHub(bin("kube-scheduler"),
		"--kubeconfig="+schedCfg,
		"--authentication-kubeconfig="+schedCfg, "--authorization-kubeconfig="+schedCfg,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--v=1")...)
	return err
}

// Dial opens a TCP connection from inside the hub namespace, where the
// apiserver and the nodes' addresses are reachable.
func (c *Cluster) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := netns.Do(c.Hub, func() error {
		var d net.Dialer
		var derr error
		conn, derr = d.DialContext(ctx, network, addr)
		return derr
	})
	return conn, err
}

// RESTConfig is an admin client config that dials through the hub.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	crt, err := os.ReadFile(c.pki.path("admin.crt"))
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(c.pki.path("admin.key"))
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            c.apiURL(),
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM, CertData: crt, KeyData: key},
		Dial:            c.Dial,
		QPS:             100, Burst: 200,
		UserAgent: "cutover-cluster",
	}, nil
}

// Clientset is an admin typed client.
func (c *Cluster) Clientset() (kubernetes.Interface, error) {
	rc, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

func (c *Cluster) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	cert, err := tls.LoadX509KeyPair(c.pki.path("admin.crt"), c.pki.path("admin.key"))
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     c.Dial,
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		for _, p := range []*proc{c.etcd, c.apiserver} {
			if p.exited() {
				return fmt.Errorf("cluster: %s exited: %w\n%s", p.name, p.waitErr, p.tail(30))
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.apiURL()+"/readyz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: kube-apiserver not ready after %v (last: %s)\n%s", timeout, last, c.apiserver.tail(30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		notReady := c.notReadyNodes(ctx, cs)
		if len(notReady) == 0 {
			return nil
		}
		for _, n := range c.Nodes {
			for _, p := range []*proc{n.containerd, n.kubelet, n.kubeProxy} {
				if p != nil && p.exited() {
					return fmt.Errorf("cluster: node %s: %s exited: %w\n%s", n.Name, p.name, p.waitErr, p.tail(30))
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: nodes not Ready after %v: %s", timeout, strings.Join(notReady, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// notReadyNodes names each expected node that is not Ready, and why.
func (c *Cluster) notReadyNodes(ctx context.Context, cs kubernetes.Interface) []string {
	var out []string
	for _, n := range c.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			out = append(out, n.Name+": "+err.Error())
			continue
		}
		ready := false
		why := "no Ready condition"
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status == corev1.ConditionTrue
				why = cond.Reason + ": " + cond.Message
			}
		}
		if !ready {
			out = append(out, n.Name+": "+why)
		}
	}
	return out
}

// Command runs argv inside the hub namespace (kubectl, the kubectl plugin,
// coordctl) with KUBECONFIG set to the admin kubeconfig.
func (c *Cluster) Command(ctx context.Context, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + filepath.Join(netns.Dir, c.Hub), "--"}, argv...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	return cmd
}

// Kubectl runs the cluster's kubectl (the pinned one) with args in the
// hub namespace and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{KubectlPath()}, args...)
	out, err := c.Command(ctx, argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Down stops every node and the control plane, and removes the namespaces,
// cgroups and mounts the cluster made. Safe to call twice.
func (c *Cluster) Down() error {
	var errs []error
	var wg sync.WaitGroup
	nerrs := make([]error, len(c.Nodes))
	for i, n := range c.Nodes {
		if n == nil {
			continue
		}
		wg.Add(1)
		go func(i int, n *Node) {
			defer wg.Done()
			nerrs[i] = n.stop()
		}(i, n)
	}
	wg.Wait()
	errs = append(errs, nerrs...)
	c.mu.Lock()
	for _, p := range []*proc{c.scheduler, c.kcm, c.apiserver, c.etcd} {
		errs = append(errs, p.stop(stopWait))
	}
	c.mu.Unlock()
	if c.etcdData != "" {
		errs = append(errs, os.RemoveAll(c.etcdData))
		c.etcdData = ""
	}
	errs = append(errs, Teardown(c.cfg.Name))
	return errors.Join(errs...)
}

// Dir is Config.Dir: the control plane's logs, and a directory per node.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// UserKubeconfig writes a kubeconfig for user name in groups (no
// system:masters): what RBAC grants it is what it may do.
func (c *Cluster) UserKubeconfig(name string, groups ...string) (string, error) {
	return c.pki.kubeconfig("user-"+name, name, groups, c.apiURL())
}
