package kubectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/cutover-dev/cutover/coordinator/cli"
)

// Config says where the coordinator lives in the cluster. The defaults
// are the manifests' (deploy/base).
type Config struct {
	Kubeconfig string // empty: KUBECONFIG, then ~/.kube/config (kubectl's rules)
	Context    string
	Namespace  string // of the coordinator, its leader lock and the admin Secret
	Lease      string // the leader lock's name: the Lease, or the ConfigMap
	// Lock is which object the coordinators elect their leader on, as
	// their --leader-lock: LockLease, LockConfigMap, or LockAuto (the
	// Lease, else the ConfigMap).
	Lock   string
	Secret string // the admin client certificate (ca.crt, tls.crt, tls.key)
	Port   int    // the coordinator's gRPC port in its pod
}

// Leader locks (--leader-lock), as the coordinator's own flag names them.
const (
	LockAuto      = "auto"
	LockLease     = "lease"
	LockConfigMap = "configmap"
)

// leaderAnnotation holds the record on a ConfigMap lock: the coordinator
// writes it there (coordinator/kube LeaderAnnotation; the test pins the
// two together) in client-go's LeaderElectionRecord JSON.
const leaderAnnotation = "control-plane.alpha.kubernetes.io/leader"

// Default returns the manifests' names.
func Default() Config {
	return Config{Namespace: "cutover", Lease: "cutover-coordinator", Lock: LockAuto, Secret: "cutover-admin-tls", Port: 9446}
}

// AddFlags adds the plugin's flags.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&c.Context, "context", c.Context, "kubeconfig context (default: the current one)")
	fs.StringVar(&c.Namespace, "cutover-namespace", c.Namespace, "namespace of the coordinator, its leader lock and the admin Secret")
	fs.StringVar(&c.Lease, "lease", c.Lease, "name of the coordinator's leader lock (its Lease, or its ConfigMap under --leader-lock=configmap)")
	fs.StringVar(&c.Lock, "leader-lock", c.Lock, "the object the coordinators elect their leader on, as their --leader-lock: lease, configmap (the openshift overlay), or auto (the Lease, else the ConfigMap)")
	fs.StringVar(&c.Secret, "admin-secret", c.Secret, "Secret with coordctl's client certificate (ca.crt, tls.crt, tls.key)")
	fs.IntVar(&c.Port, "coordinator-port", c.Port, "the coordinator's gRPC port in its pod")
}

// Validate names the flag, the value and the reason of a bad setting.
func (c *Config) Validate() error {
	for _, f := range []struct{ flag, v string }{{"--cutover-namespace", c.Namespace}, {"--lease", c.Lease}, {"--admin-secret", c.Secret}} {
		if f.v == "" {
			return fmt.Errorf("%s is empty: give the name (default from the manifests)", f.flag)
		}
	}
	switch c.Lock {
	case LockAuto, LockLease, LockConfigMap:
	default:
		return fmt.Errorf("--leader-lock %q: want %s, %s (as the coordinator's --leader-lock) or %s (the Lease, else the ConfigMap)", c.Lock, LockLease, LockConfigMap, LockAuto)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("--coordinator-port %d: want 1-65535", c.Port)
	}
	return nil
}

// RESTConfig loads the kubeconfig as kubectl does.
func (c *Config) RESTConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if c.Kubeconfig != "" {
		rules.ExplicitPath = c.Kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w (give --kubeconfig and --context as for kubectl)", err)
	}
	return rc, nil
}

// Leader is the pod of the leading coordinator: the live holder of the
// leader lock, running.
func (c *Config) Leader(ctx context.Context, cs kubernetes.Interface) (*corev1.Pod, error) {
	lock, rec, err := c.lockRecord(ctx, cs)
	if err != nil {
		return nil, err
	}
	holder := rec.HolderIdentity
	if holder == "" {
		return nil, fmt.Errorf("%s has no holder: no coordinator leads right now (kubectl -n %s get pods -l app.kubernetes.io/name=cutover-coordinator)", lock, c.Namespace)
	}
	if !rec.RenewTime.IsZero() && rec.LeaseDurationSeconds > 0 {
		if exp := rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second); time.Since(exp) > 0 {
			return nil, fmt.Errorf("%s: its holder %s last renewed it at %s and it expired %s ago: no coordinator leads right now (kubectl -n %s get pods -l app.kubernetes.io/name=cutover-coordinator)",
				lock, holder, rec.RenewTime.UTC().Format(time.RFC3339), time.Since(exp).Round(time.Second), c.Namespace)
		}
	}
	pod, err := cs.CoreV1().Pods(c.Namespace).Get(ctx, holder, metav1.GetOptions{})
	if err != nil {
		return nil, apiError(err, "get", "pods", c.Namespace, holder, "the "+lock+" names it as the leading coordinator")
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName == "" {
		return nil, fmt.Errorf("coordinator pod %s/%s (the holder of %s) is %s on node %q: it cannot be reached until it runs", c.Namespace, holder, lock, orUnknown(string(pod.Status.Phase)), pod.Spec.NodeName)
	}
	return pod, nil
}

// lockRecord reads the leader lock c.Lock names, and says which it read
// ("lease NS/NAME" or "configmap NS/NAME"). Under LockAuto a Lease that
// is missing, or not served (OpenShift 3.11 has none), or not readable,
// sends it to the ConfigMap; when neither is there the error names both.
func (c *Config) lockRecord(ctx context.Context, cs kubernetes.Interface) (string, *resourcelock.LeaderElectionRecord, error) {
	var leaseErr error
	if c.Lock != LockConfigMap {
		l, err := cs.CoordinationV1().Leases(c.Namespace).Get(ctx, c.Lease, metav1.GetOptions{})
		if err == nil {
			return "lease " + c.Namespace + "/" + c.Lease, resourcelock.LeaseSpecToLeaderElectionRecord(&l.Spec), nil
		}
		leaseErr = apiError(err, "get", "leases.coordination.k8s.io", c.Namespace, c.Lease,
			"is the coordinator deployed (deploy/, docs/deploy.md) and --cutover-namespace/--lease right?")
		if c.Lock == LockLease || (!apierrors.IsNotFound(err) && !apierrors.IsForbidden(err)) {
			return "", nil, leaseErr
		}
	}
	name := "configmap " + c.Namespace + "/" + c.Lease
	cm, err := cs.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Lease, metav1.GetOptions{})
	if err == nil && cm.Annotations[leaderAnnotation] == "" {
		err = fmt.Errorf("configmap %s/%s has no annotation %s: it is not a leader lock, or no coordinator has taken it yet", c.Namespace, c.Lease, leaderAnnotation)
	} else if err != nil {
		err = apiError(err, "get", "configmaps", c.Namespace, c.Lease,
			"is the coordinator deployed with --leader-lock=configmap (deploy/overlays/openshift) and --cutover-namespace/--lease right?")
	}
	if err != nil {
		if leaseErr != nil {
			return "", nil, fmt.Errorf("no leader lock found (--leader-lock=auto looked for a Lease, then a ConfigMap): %w; %w", leaseErr, err)
		}
		return "", nil, err
	}
	var rec resourcelock.LeaderElectionRecord
	if err := json.Unmarshal([]byte(cm.Annotations[leaderAnnotation]), &rec); err != nil {
		return "", nil, fmt.Errorf("configmap %s/%s annotation %s: %w: not a leader election record", c.Namespace, c.Lease, leaderAnnotation, err)
	}
	return name, &rec, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "Unknown"
	}
	return s
}

// SaveIdentity writes the admin Secret's ca.crt, tls.crt and tls.key into
// dir (mode 0600): the layout coordctl's --tls-dir reads.
func (c *Config) SaveIdentity(ctx context.Context, cs kubernetes.Interface, dir string) error {
	s, err := cs.CoreV1().Secrets(c.Namespace).Get(ctx, c.Secret, metav1.GetOptions{})
	if err != nil {
		return apiError(err, "get", "secrets", c.Namespace, c.Secret,
			"it holds coordctl's client certificate (made by cert-manager or coordctl certs, docs/deploy.md)")
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(s.Data[k]) == 0 {
			return fmt.Errorf("secret %s/%s has no %s: want ca.crt, tls.crt and tls.key (a cert-manager TLS Secret; docs/deploy.md)", c.Namespace, c.Secret, k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), s.Data[k], 0o600); err != nil {
			return err
		}
	}
	return nil
}

// apiError says what was asked, of what, and what to do: RBAC refusals
// name the verb and resource to ask an administrator for.
func apiError(err error, verb, resource, ns, name, hint string) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed to %s %s %s/%s (RBAC): ask for %q on %s in namespace %s, or use coordctl with --coordinator and --tls-dir: %w",
			verb, resource, ns, name, verb, resource, ns, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %s/%s not found: %s: %w", resource, ns, name, hint, err)
	}
	return fmt.Errorf("%s %s %s/%s: %w", verb, resource, ns, name, err)
}

// Install makes root the plugin: its flags, and a Resolve that finds the
// coordinator before each connection unless --coordinator is given.
func Install(root *cobra.Command, g *cli.Globals) {
	cfg := Default()
	cfg.AddFlags(root.PersistentFlags())
	root.Use = "kubectl-cutover"
	root.Short = "Cutover's coordctl as a kubectl plugin: finds the coordinator through the kubeconfig"
	g.Resolve = func(g *cli.Globals) (io.Closer, error) {
		if root.PersistentFlags().Changed("coordinator") {
			return nil, nil
		}
		if err := cfg.Validate(); err != nil {
			return nil, cli.Exitf(cli.ExitUsage, "%v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
		defer cancel()
		conn, err := cfg.Connect(ctx)
		if err != nil {
			return nil, cli.Exitf(cli.ExitUnreachable, "kubectl cutover: %v", err)
		}
		g.Coordinator = conn.Address
		if g.TLSDir == "" && !g.Insecure {
			g.TLSDir = conn.TLSDir
		}
		return conn, nil
	}
}

// Conn is a way to the coordinator: a local address forwarded to its pod,
// and the admin identity saved in TLSDir. Close stops the forward and
// deletes the identity.
type Conn struct {
	Address string
	TLSDir  string
	stop    func()
}

// Close stops the port-forward and removes the saved identity.
func (c *Conn) Close() error {
	if c.stop != nil {
		c.stop()
	}
	return os.RemoveAll(c.TLSDir)
}

// Connect finds the leader, saves the admin identity and forwards a local
// port to the leader's gRPC port.
func (c *Config) Connect(ctx context.Context) (*Conn, error) {
	rc, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	pod, err := c.Leader(ctx, cs)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubectl-cutover-")
	if err != nil {
		return nil, err
	}
	if err := c.SaveIdentity(ctx, cs, dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	addr, stop, err := forward(ctx, rc, cs, pod, c.Port)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Conn{Address: addr, TLSDir: dir, stop: stop}, nil
}

var errNoPorts = errors.New("port-forward reported no local port")
