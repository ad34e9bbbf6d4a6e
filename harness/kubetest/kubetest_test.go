package kubetest_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// One apiserver for the whole test: each start costs seconds.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t)
	ctx := context.Background()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ConfigMapRoundTrip", func(t *testing.T) {
		want := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"},
			Data:       map[string]string{"port": "4889"},
		}
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, want, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Data["port"] != "4889" || got.UID == "" || got.ResourceVersion == "" {
			t.Fatalf("read back %+v, want data port=4889 with a UID and resourceVersion from etcd", got)
		}
	})

	t.Run("KubeconfigFile", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kc.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{}); err != nil {
			t.Fatalf("client from %s: %v", c.Kubeconfig, err)
		}
	})

	// Services get their cluster IPs from the 198.18.0.0/15 service range.
	t.Run("ServiceRange", func(t *testing.T) {
		svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 9443}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, ipnet, _ := net.ParseCIDR(kubetest.ServiceClusterIPRange)
		if ip := net.ParseIP(svc.Spec.ClusterIP); ip == nil || !ipnet.Contains(ip) {
			t.Fatalf("Service clusterIP %q, want one in %s", svc.Spec.ClusterIP, ipnet)
		}
	})

	// RBAC is enforced: an impersonated service account without bindings is
	// forbidden, and allowed once bound.
	t.Run("RBACEnforced", func(t *testing.T) {
		sa, err := kubernetes.NewForConfig(c.ServiceAccount("default", "nobody"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = sa.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("unbound service account read a ConfigMap: err=%v, want Forbidden", err)
		}
		err = c.Apply(ctx, []byte(`
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: default}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: cm-reader, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
subjects:
- {kind: ServiceAccount, name: nobody, namespace: default}
`), kubetest.ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The authorizer learns the binding from its informer, a moment
		// after the write (a CI run was refused right after it): retried
		// for 5 s, as a client would.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, err := sa.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
			if err == nil {
				break
			}
			if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
				t.Fatalf("bound service account: %v", err)
			}
		}
	})

	// A dry run validates but persists nothing, and every refusal is named.
	t.Run("ApplyDryRun", func(t *testing.T) {
		err := c.Apply(ctx, []byte(`
apiVersion: v1
kind: ConfigMap
metadata: {name: dry, namespace: default}
data: {a: b}
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec: {clusterIP: 192.0.2.1, ports: [{port: 80}]}
---
apiVersion: example.invalid/v1
kind: Nope
metadata: {name: nope}
`), kubetest.ApplyOptions{DryRun: true, MappingTimeout: time.Second})
		var oe *kubetest.ObjectError
		if !errors.As(err, &oe) {
			t.Fatalf("err %v, want ObjectErrors", err)
		}
		msg := err.Error()
		for _, want := range []string{"Service default/bad", "Nope nope", "CRD not installed"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error does not name %q:\n%s", want, msg)
			}
		}
		if strings.Contains(msg, "ConfigMap default/dry") {
			t.Errorf("valid ConfigMap refused:\n%s", msg)
		}
		if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("dry run persisted the ConfigMap: err=%v", err)
		}
	})
}

// The cached binary names must follow the versions pinned in tools/kube.
func TestVersionsMatchToolsModule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "tools", "kube", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for mod, want := range map[string]string{
		"k8s.io/kubernetes":                  kubetest.KubernetesVersion,
		"sigs.k8s.io/kustomize/kustomize/v5": kubetest.KustomizeVersion,
	} {
		m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(mod) + `\s+(v\S+)`).FindSubmatch(b)
		if m == nil {
			t.Errorf("tools/kube/go.mod does not require %s", mod)
			continue
		}
		if string(m[1]) != want {
			t.Errorf("tools/kube/go.mod pins %s %s, kubetest expects %s", mod, m[1], want)
		}
	}
}

func TestStartServerNeedsDir(t *testing.T) {
	_, err := kubetest.StartServer(context.Background(), kubetest.Options{})
	if err == nil || !strings.Contains(err.Error(), "Options.Dir") {
		t.Fatalf("err %v, want one naming Options.Dir", err)
	}
}
