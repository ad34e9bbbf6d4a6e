package kubectl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cutover-dev/cutover/coordinator/cli"
	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/harness/kubetest"
)

func init() { cli.AddCommand(Install) }

// cluster is a real kube-apiserver with the objects the manifests make:
// the coordinator's Lease held by a running pod, and the admin Secret.
func cluster(t *testing.T) (*kubetest.Cluster, kubernetes.Interface) {
	t.Helper()
	kubetest.Require(t)
	c := kubetest.Start(t)
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cutover"}}, metav1.CreateOptions{}))
	holder := "cutover-coordinator-7d9f-abcde"
	dur := int32(15)
	must(cs.CoordinationV1().Leases("cutover").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cutover-coordinator"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &metav1.MicroTime{Time: time.Now()}}}, metav1.CreateOptions{}))
	pod, err := cs.CoreV1().Pods("cutover").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: holder},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "coordinator", Image: "cutover/coordinator"}}}}, metav1.CreateOptions{})
	must(pod, err)
	pod.Status.Phase = corev1.PodRunning
	must(cs.CoreV1().Pods("cutover").UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
	must(cs.CoreV1().Secrets("cutover").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cutover-admin-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"ca.crt": []byte("CA PEM"), "tls.crt": []byte("CERT PEM"), "tls.key": []byte("KEY PEM")}}, metav1.CreateOptions{}))
	return c, cs
}

// TestDiscoveryOnAPIServer: on a real apiserver the plugin finds the
// Lease's holder, saves the admin Secret as coordctl's --tls-dir layout,
// and says what is wrong when the Lease is missing or expired, the pod
// does not run, or RBAC refuses the Secret. The port-forward itself needs
// a kubelet (none here): its error reaches the user through coordctl's
// exit code 3, naming the pod.
func TestDiscoveryOnAPIServer(t *testing.T) {
	c, cs := cluster(t)
	ctx := context.Background()
	cfg := Default()
	pod, err := cfg.Leader(ctx, cs)
	if err != nil || pod.Name != "cutover-coordinator-7d9f-abcde" {
		t.Fatalf("leader: %v %v", pod.GetName(), err)
	}
	dir := t.TempDir()
	if err := cfg.SaveIdentity(ctx, cs, dir); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"ca.crt": "CA PEM", "tls.crt": "CERT PEM", "tls.key": "KEY PEM"} {
		b, err := os.ReadFile(filepath.Join(dir, k))
		st, _ := os.Stat(filepath.Join(dir, k))
		if err != nil || string(b) != want || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %q %v mode %v", k, b, err, st.Mode())
		}
	}
	if f, err := cli.TLSDirFiles(dir); err != nil || f.Cert != filepath.Join(dir, "tls.crt") {
		t.Errorf("coordctl does not read the saved identity: %v %v", f, err)
	}

	// Errors that say what to do.
	bad := cfg
	bad.Lease = "nope"
	if _, err := bad.Leader(ctx, cs); err == nil || !strings.Contains(err.Error(), "leases.coordination.k8s.io cutover/nope not found") {
		t.Errorf("missing Lease: %v", err)
	}
	bad = cfg
	bad.Secret = "nope"
	if err := bad.SaveIdentity(ctx, cs, t.TempDir()); err == nil || !strings.Contains(err.Error(), "secrets cutover/nope not found") {
		t.Errorf("missing Secret: %v", err)
	}

	// RBAC: a user who may read the Lease and pods but not Secrets.
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.RbacV1().Roles("cutover").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}))
	must(cs.RbacV1().RoleBindings("cutover").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "viewer"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "alice"}}}, metav1.CreateOptions{}))
	alice, err := kubernetes.NewForConfig(c.Impersonate("alice", "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer learns the RoleBinding through an informer: a CI run
	// was refused right after it was written. Poll for 5 s, as a client
	// would retry.
	var lerr error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, lerr = cfg.Leader(ctx, alice); lerr == nil || time.Now().After(deadline) {
			break
		}
	}
	if lerr != nil {
		t.Errorf("alice may read the Lease and the pod: %v", lerr)
	}
	err = cfg.SaveIdentity(ctx, alice, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `not allowed to get secrets cutover/cutover-admin-tls (RBAC): ask for "get" on secrets in namespace cutover`) {
		t.Errorf("RBAC-denied Secret: %v", err)
	}

	// The whole plugin from a kubeconfig: discovery and the Secret work,
	// the port-forward fails for want of a kubelet, and says so.
	var out, errb bytes.Buffer
	code := cli.Execute([]string{"--kubeconfig", c.Kubeconfig, "--timeout", "20s", "agents"}, &out, &errb)
	if code != cli.ExitUnreachable || !strings.Contains(errb.String(), "port-forward to coordinator pod cutover/cutover-coordinator-7d9f-abcde port 9446") {
		t.Errorf("plugin without a kubelet: exit %d, stderr %s", code, errb.String())
	}
	leftovers, _ := filepath.Glob(filepath.Join(os.TempDir(), "kubectl-cutover-*"))
	for _, l := range leftovers {
		if st, err := os.Stat(l); err == nil && time.Since(st.ModTime()) < time.Minute {
			t.Errorf("saved identity %s left behind after a failed connection", l)
		}
	}

	// The pod not running, the Lease expired: named.
	pod.Status.Phase = corev1.PodPending
	must(cs.CoreV1().Pods("cutover").UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
	if _, err := cfg.Leader(ctx, cs); err == nil || !strings.Contains(err.Error(), "is Pending") {
		t.Errorf("pending pod: %v", err)
	}
	l, err := cs.CoordinationV1().Leases("cutover").Get(ctx, "cutover-coordinator", metav1.GetOptions{})
	must(l, err)
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Minute)}
	must(cs.CoordinationV1().Leases("cutover").Update(ctx, l, metav1.UpdateOptions{}))
	if _, err := cfg.Leader(ctx, cs); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired Lease: %v", err)
	}
}

// TestPluginBadInput: an empty name, a bad port or an unknown lock kind is
// refused naming the flag, exit 2, before any connection; --coordinator
// given explicitly bypasses discovery (coordctl's own way).
func TestPluginBadInput(t *testing.T) {
	var out, errb bytes.Buffer
	code := cli.Execute([]string{"--admin-secret", "", "agents"}, &out, &errb)
	if code != cli.ExitUsage || !strings.HasPrefix(errb.String(), "kubectl-cutover: --admin-secret is empty") {
		t.Errorf("empty --admin-secret: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	code = cli.Execute([]string{"--coordinator-port", "70000", "agents"}, &out, &errb)
	if code != cli.ExitUsage || !strings.Contains(errb.String(), "--coordinator-port 70000") {
		t.Errorf("bad port: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	code = cli.Execute([]string{"--leader-lock", "etcd", "agents"}, &out, &errb)
	if code != cli.ExitUsage || !strings.Contains(errb.String(), `--leader-lock "etcd": want lease, configmap`) {
		t.Errorf("bad --leader-lock: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	code = cli.Execute([]string{"--coordinator", "127.0.0.1:1", "--insecure", "--timeout", "2s", "agents"}, &out, &errb)
	if code != cli.ExitUnreachable || strings.Contains(errb.String(), "kubeconfig") || !strings.Contains(errb.String(), "127.0.0.1:1") {
		t.Errorf("explicit --coordinator: exit %d: %s", code, errb.String())
	}
}

// TestDiscoveryConfigMapLock: on an apiserver that serves no Leases (as
// OpenShift 3.11, where the openshift overlay runs the coordinators with
// --leader-lock=configmap), the plugin finds the leader from the record
// the coordinator's own elector writes on the ConfigMap, by default
// (auto) and with --leader-lock=configmap, and says what is wrong when
// the lock is missing, released, expired or not a lock.
func TestDiscoveryConfigMapLock(t *testing.T) {
	if leaderAnnotation != kube.LeaderAnnotation {
		t.Fatalf("the plugin reads annotation %s, the coordinator writes %s", leaderAnnotation, kube.LeaderAnnotation)
	}
	kubetest.Require(t)
	c, err := kubetest.StartServer(context.Background(), kubetest.Options{Dir: t.TempDir(),
		ExtraAPIServerArgs: []string{"--runtime-config=coordination.k8s.io/v1=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cutover"}}, metav1.CreateOptions{}))
	holder := "cutover-coordinator-5c8d-fghij"
	pod, err := cs.CoreV1().Pods("cutover").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: holder},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "coordinator", Image: "cutover/coordinator"}}}}, metav1.CreateOptions{})
	must(pod, err)
	pod.Status.Phase = corev1.PodRunning
	must(cs.CoreV1().Pods("cutover").UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
	must(cs.CoreV1().Secrets("cutover").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cutover-admin-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"ca.crt": []byte("CA PEM"), "tls.crt": []byte("CERT PEM"), "tls.key": []byte("KEY PEM")}}, metav1.CreateOptions{}))

	auto, cmLock, lease := Default(), Default(), Default()
	cmLock.Lock, lease.Lock = LockConfigMap, LockLease
	expect := func(what string, cfg Config, want ...string) {
		t.Helper()
		_, err := cfg.Leader(ctx, cs)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", what, err, w)
			}
		}
	}

	// No lock at all: both objects named, with what to check.
	expect("missing lock, auto", auto, "no leader lock found",
		"leases.coordination.k8s.io cutover/cutover-coordinator not found", "configmaps cutover/cutover-coordinator not found",
		"--leader-lock=configmap (deploy/overlays/openshift)")
	expect("missing lock, configmap", cmLock, "configmaps cutover/cutover-coordinator not found")
	if _, err := cmLock.Leader(ctx, cs); err != nil && strings.Contains(err.Error(), "leases") {
		t.Errorf("--leader-lock=configmap looked at a Lease: %v", err)
	}

	// The coordinator's own elector takes the ConfigMap lock as the pod.
	lc := kube.DefaultLeader()
	lc.Namespace, lc.Identity, lc.Lock = "cutover", holder, kube.LockConfigMap
	lc.LeaseDuration, lc.RenewDeadline, lc.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	started := make(chan struct{})
	e, err := kube.NewElector(cs, lc, func(context.Context) { close(started) }, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(ectx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the elector never took the ConfigMap lock")
	}
	for _, cfg := range []Config{auto, cmLock} {
		if p, err := cfg.Leader(ctx, cs); err != nil || p.Name != holder {
			t.Errorf("--leader-lock=%s: leader %v, %v; want %s", cfg.Lock, p.GetName(), err, holder)
		}
	}
	// --leader-lock=lease does not fall back: 3.11 serves no Lease.
	expect("--leader-lock=lease without Leases", lease, "leases.coordination.k8s.io cutover/cutover-coordinator not found")

	// The whole plugin from a kubeconfig reaches the pod's port-forward
	// (which fails for want of a kubelet, naming the pod).
	var out, errb bytes.Buffer
	code := cli.Execute([]string{"--kubeconfig", c.Kubeconfig, "--timeout", "20s", "agents"}, &out, &errb)
	if code != cli.ExitUnreachable || !strings.Contains(errb.String(), "port-forward to coordinator pod cutover/"+holder+" port 9446") {
		t.Errorf("plugin under the ConfigMap lock: exit %d, stderr %s", code, errb.String())
	}

	// Released: a leader that stops clears the holder.
	stop()
	<-done
	done <- nil // for the cleanup
	expect("released lock", auto, "configmap cutover/cutover-coordinator has no holder: no coordinator leads right now")

	// Expired: a holder that stopped renewing a minute ago.
	setAnnotation := func(v string) {
		t.Helper()
		cm, err := cs.CoreV1().ConfigMaps("cutover").Get(ctx, "cutover-coordinator", metav1.GetOptions{})
		must(cm, err)
		if v == "" {
			delete(cm.Annotations, kube.LeaderAnnotation)
		} else {
			cm.Annotations[kube.LeaderAnnotation] = v
		}
		must(cs.CoreV1().ConfigMaps("cutover").Update(ctx, cm, metav1.UpdateOptions{}))
	}
	renew := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	setAnnotation(`{"holderIdentity":"` + holder + `","leaseDurationSeconds":15,"acquireTime":"` + renew + `","renewTime":"` + renew + `","leaderTransitions":1}`)
	expect("expired holder", auto, "configmap cutover/cutover-coordinator: its holder "+holder+" last renewed it at "+renew+" and it expired")
	setAnnotation("not json")
	expect("garbage record", auto, "annotation "+kube.LeaderAnnotation, "not a leader election record")
	setAnnotation("")
	expect("ConfigMap that is no lock", cmLock, "has no annotation "+kube.LeaderAnnotation)
}
