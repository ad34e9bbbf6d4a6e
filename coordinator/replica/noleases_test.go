package replica

// The coordinator binary's cluster mode on an apiserver that serves no
// coordination.k8s.io (OpenShift 3.11 is Kubernetes 1.11), with
// --leader-lock=configmap as the openshift overlay sets it: one replica
// leads, the other is Ready and forwards the API to it (it finds the
// leader from the ConfigMap lock), and takes over when the leader is cut
// off from the apiserver.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/harness/kubetest"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func TestClusterWithoutLeases(t *testing.T) {
	kubetest.Require(t)
	kubetest.RequireKustomize(t)
	c, err := kubetest.StartServer(context.Background(), kubetest.Options{Dir: t.TempDir(),
		ExtraAPIServerArgs: []string{"--runtime-config=coordination.k8s.io/v1=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the apiserver serves Leases: the test does not stand in for 3.11")
	}
	installRBAC(t, c, admin)
	lis := map[string]*bufconn.Listener{}
	for i, node := range []string{"n1", "n2"} {
		ip := fmt.Sprintf("198.18.0.%d", i+1)
		mkNodeWithAgent(t, admin, node, ip)
		l := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		fakeagent.Register(s, fakeagent.New(node, 4789))
		go func() { _ = s.Serve(l) }()
		t.Cleanup(s.Stop)
		lis[ip+":9443"] = l
	}
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no test agent at %s", addr)
	})
	cmLock := func(k *kube.Config) { k.Leader.Lock = kube.LockConfigMap; k.CNI = "" }
	sa := c.ServiceAccount(ns, "cutover-coordinator")
	port := sharedPort(t)
	a := startReplica(t, ctx, admin, sa, "coord-a", "127.0.0.2:"+port, dial, cmLock)
	waitFor(t, "A to lead and be ready", 30*time.Second, func() bool { code, _ := a.readyz(); return code == http.StatusOK })
	b := startReplica(t, ctx, admin, sa, "coord-b", "127.0.0.3:"+port, dial, cmLock)
	waitFor(t, "B ready as a standby", 10*time.Second, func() bool { code, _ := b.readyz(); return code == http.StatusOK })
	var agents *coordinatorv1.ListAgentsResponse
	waitFor(t, "B to forward ListAgents to A", 10*time.Second, func() bool {
		agents, err = b.api.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{})
		return err == nil
	})
	if len(agents.GetAgents()) != 2 {
		t.Errorf("ListAgents through standby B: %v", agents)
	}
	if h, err := kube.Holder(ctx, admin, kube.LeaderConfig{Namespace: ns, Name: kube.DefaultLeader().Name, Lock: kube.LockConfigMap}); err != nil || h != "coord-a" {
		t.Errorf("lock holder %q, %v; want coord-a", h, err)
	}

	a.net.cut.Store(true)
	select {
	case err := <-a.done:
		if err == nil {
			t.Error("A's Run returned nil after losing the apiserver, want the lost lock")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("A did not stop after losing the apiserver")
	}
	waitFor(t, "B to lead", 30*time.Second, func() bool {
		h, err := kube.Holder(ctx, admin, kube.LeaderConfig{Namespace: ns, Name: kube.DefaultLeader().Name, Lock: kube.LockConfigMap})
		return err == nil && h == "coord-b"
	})
	waitFor(t, "B to serve Plan itself", 15*time.Second, func() bool {
		pr, err := b.api.Plan(ctx, &coordinatorv1.CutoverRequest{Port: 4889})
		return err == nil && len(pr.GetProblems()) == 0
	})
}
