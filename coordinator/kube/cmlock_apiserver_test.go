package kube

// The ConfigMap leader lock (--leader-lock=configmap) against a real
// kube-apiserver: two candidates, one leader; the leader cut off from the
// apiserver stops leading before the other takes over; and on an
// apiserver that serves no coordination.k8s.io (as OpenShift 3.11, which
// is Kubernetes 1.11) the ConfigMap lock elects while the Lease lock
// cannot.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/cutover-dev/cutover/harness/kubetest"
)

func cmLeader(id, name string) LeaderConfig {
	c := DefaultLeader()
	c.Identity, c.Name, c.Namespace, c.Lock = id, name, ns, LockConfigMap
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	return c
}

// candidate runs an elector and counts how many lead at once in leading.
type candidate struct {
	e       *Elector
	started chan time.Time
	stopped chan time.Time
	done    chan struct{} // closed when Run returned, with its error in err
	err     error
}

func campaign(t *testing.T, ctx context.Context, cs kubernetes.Interface, cfg LeaderConfig, leading, most *atomic.Int32) *candidate {
	t.Helper()
	c := &candidate{started: make(chan time.Time, 1), stopped: make(chan time.Time, 1), done: make(chan struct{})}
	e, err := NewElector(cs, cfg, func(lctx context.Context) {
		n := leading.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		c.started <- time.Now()
		<-lctx.Done()
		leading.Add(-1)
		c.stopped <- time.Now()
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.e = e
	ctx, cancel := context.WithCancel(ctx)
	go func() { c.err = e.Run(ctx); close(c.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			t.Error("an elector did not stop")
		}
	})
	return c
}

func waitTime(t *testing.T, ch <-chan time.Time, d time.Duration, what string) time.Time {
	t.Helper()
	select {
	case at := <-ch:
		return at
	case <-time.After(d):
		t.Fatalf("%s: not within %s", what, d)
	}
	return time.Time{}
}

// testConfigMapLock runs with the coordinator's ServiceAccount (the
// deploy/ RBAC): A leads, B waits; A is cut off from the apiserver and
// stops leading; B takes over; never two leaders.
func (e *env) testConfigMapLock(t *testing.T) {
	ctx := context.Background()
	const name = "cutover-coordinator-cm"
	var leading, most atomic.Int32
	aCS, aNet := partitioned(t, e.sa)
	a := campaign(t, ctx, aCS, cmLeader("coord-a", name), &leading, &most)
	waitTime(t, a.started, 30*time.Second, "A leads")
	bCS, err := kubernetes.NewForConfig(e.sa)
	if err != nil {
		t.Fatal(err)
	}
	b := campaign(t, ctx, bCS, cmLeader("coord-b", name), &leading, &most)
	time.Sleep(2 * time.Second) // several of B's retry periods
	if b.e.IsLeader() {
		t.Fatal("B leads while A holds the ConfigMap lock")
	}
	if h, err := Holder(ctx, e.admin, cmLeader("reader", name)); err != nil || h != "coord-a" {
		t.Fatalf("Holder = %q, %v; want coord-a", h, err)
	}
	cm, err := e.admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || cm.Annotations[LeaderAnnotation] == "" {
		t.Fatalf("lock ConfigMap: %v, annotations %v", err, cm.Annotations)
	}

	aNet.cut.Store(true) // A stops renewing: it cannot reach the apiserver
	aStopped := waitTime(t, a.stopped, 30*time.Second, "A stops leading after the partition")
	bStarted := waitTime(t, b.started, 30*time.Second, "B takes over")
	if !aStopped.Before(bStarted) {
		t.Errorf("A stopped at %s, after B started at %s", aStopped, bStarted)
	}
	<-a.done
	if !errors.Is(a.err, ErrLeaseLost) {
		t.Errorf("A's Run = %v, want ErrLeaseLost", a.err)
	}
	if h, err := Holder(ctx, e.admin, cmLeader("reader", name)); err != nil || h != "coord-b" {
		t.Errorf("Holder after failover = %q, %v; want coord-b", h, err)
	}
	if m := most.Load(); m != 1 {
		t.Errorf("%d candidates led at once", m)
	}
}

// TestLeaderLockWithoutLeases: an apiserver with coordination.k8s.io
// switched off stands in for OpenShift 3.11. The Lease lock never elects
// there; the ConfigMap lock does, one leader of two.
func TestLeaderLockWithoutLeases(t *testing.T) {
	kubetest.Require(t)
	c, err := kubetest.StartServer(context.Background(), kubetest.Options{Dir: t.TempDir(),
		ExtraAPIServerArgs: []string{"--runtime-config=coordination.k8s.io/v1=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx := context.Background()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, cs, ns)
	if _, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the apiserver serves Leases: the test does not stand in for 3.11")
	}
	var leading, most atomic.Int32
	lease := cmLeader("coord-lease", "cutover-coordinator")
	lease.Lock = LockLease
	l := campaign(t, ctx, cs, lease, &leading, &most)
	a := campaign(t, ctx, cs, cmLeader("coord-a", "cutover-coordinator"), &leading, &most)
	b := campaign(t, ctx, cs, cmLeader("coord-b", "cutover-coordinator"), &leading, &most)
	var first *candidate
	select {
	case <-a.started:
		first = a
	case <-b.started:
		first = b
	case <-time.After(30 * time.Second):
		t.Fatal("no ConfigMap-lock candidate leads")
	}
	time.Sleep(2 * time.Second)
	if m := most.Load(); m != 1 {
		t.Errorf("%d candidates led at once", m)
	}
	if l.e.IsLeader() {
		t.Error("the Lease candidate leads on an apiserver without Leases")
	}
	want := "coord-a"
	if first == b {
		want = "coord-b"
	}
	if h, err := Holder(ctx, cs, cmLeader("reader", "cutover-coordinator")); err != nil || h != want {
		t.Errorf("Holder = %q, %v; want %s, the one that leads", h, err, want)
	}
}

// testConfigMapLockCAS: the lock's writes carry the resourceVersion last
// seen, so a candidate with a stale view gets a Conflict from the
// apiserver instead of overwriting a renewal.
func (e *env) testConfigMapLockCAS(t *testing.T) {
	ctx := context.Background()
	a := &configMapLock{client: e.admin.CoreV1(), namespace: ns, name: "cas-lock", identity: "a"}
	b := &configMapLock{client: e.admin.CoreV1(), namespace: ns, name: "cas-lock", identity: "b"}
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing lock: %v, want NotFound (the elector then creates it)", err)
	}
	if err := a.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "a"}); err != nil {
		t.Fatal(err)
	}
	rec, raw, err := b.Get(ctx)
	if err != nil || rec.HolderIdentity != "a" || len(raw) == 0 {
		t.Fatalf("b reads %+v %q %v", rec, raw, err)
	}
	if err := a.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaderTransitions: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "b"}); !apierrors.IsConflict(err) {
		t.Fatalf("b's update from a stale read: %v, want a Conflict", err)
	}
	if h, _ := Holder(ctx, e.admin, LeaderConfig{Namespace: ns, Name: "cas-lock", Identity: "x", Lock: LockConfigMap}); h != "a" {
		t.Fatalf("holder %q, want a", h)
	}
}
