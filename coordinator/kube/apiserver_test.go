package kube

// Tests against a real kube-apiserver (harness/kubetest: etcd + kube-apiserver
// v1.35.4). Everything runs as the coordinator's ServiceAccount with the
// RBAC rendered from deploy/overlays/full, so these tests also prove the
// shipped least-privilege RBAC is enough for this package.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/harness/kubetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const ns = "cutover"

type env struct {
	c     *kubetest.Cluster
	admin kubernetes.Interface
	sa    *rest.Config // the coordinator's ServiceAccount
	cs    kubernetes.Interface
	dyn   dynamic.Interface
}

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

// startEnv starts the apiserver and installs the namespace, the
// coordinator's ServiceAccount and its RBAC from deploy/.
func startEnv(t *testing.T) *env {
	c := kubetest.Start(t)
	ctx := context.Background()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeYAML(kubetest.Kustomize(t, filepath.Join(repoRoot(), "deploy", "overlays", "full")))
	if err != nil {
		t.Fatal(err)
	}
	var rbac []byte
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			if o.GetKind() == "Role" || o.GetKind() == "RoleBinding" {
				ensureNamespace(t, admin, o.GetNamespace())
			}
			b, err := json.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			rbac = append(append(rbac, b...), "\n---\n"...)
		}
	}
	if err := c.Apply(ctx, rbac, kubetest.ApplyOptions{}); err != nil {
		t.Fatalf("RBAC from deploy/overlays/full: %v", err)
	}
	// Pods need the namespace's default ServiceAccount (no controller
	// manager runs to create it).
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := c.ServiceAccount(ns, "cutover-coordinator")
	cs, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	return &env{c: c, admin: admin, sa: sa, cs: cs, dyn: dyn}
}

func ensureNamespace(t *testing.T, cs kubernetes.Interface, name string) {
	if name == "" {
		return
	}
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// mkNode creates a Node and sets its Ready condition through the status
// subresource, as a kubelet would.
func (e *env) mkNode(t *testing.T, name string, ready, cordoned bool, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	n, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.NodeSpec{Unschedulable: cordoned}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// mkAgent creates an agent pod on node and sets its status (Running,
// host IP, Ready as given) as the kubelet would.
func (e *env) mkAgent(t *testing.T, name, node, hostIP string, ready bool) {
	t.Helper()
	ctx := context.Background()
	p, err := e.admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "cutover-agent"}},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "cutover/agent:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.setAgentReady(t, p, hostIP, ready)
}

func (e *env) setAgentReady(t *testing.T, p *corev1.Pod, hostIP string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP, p.Status.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	p.Status.PodIP, p.Status.PodIPs = hostIP, []corev1.PodIP{{IP: hostIP}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	if !ready {
		p.Status.Conditions[0].Reason = "ContainersNotReady"
	}
	if _, err := e.admin.CoreV1().Pods(ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// One apiserver for every test of the package: each start costs seconds.
func TestAPIServer(t *testing.T) {
	e := startEnv(t)
	t.Run("Discovery", e.testDiscovery)
	t.Run("JournalConflict", e.testJournalConflict)
	t.Run("JournalPrune", e.testJournalPrune)
	t.Run("Flannel", e.testFlannel)
	t.Run("Calico", e.testCalico)
	t.Run("Session", e.testSession)
	t.Run("HandOverWithOperationInFlight", e.testHandOver)
	t.Run("ConfigMapLock", e.testConfigMapLock)
	t.Run("ConfigMapLockCAS", e.testConfigMapLockCAS)
}

func (e *env) testDiscovery(t *testing.T) {
	ctx := context.Background()
	e.mkNode(t, "worker-1", true, false, map[string]string{"pool": "blue"})
	e.mkNode(t, "worker-2", true, false, map[string]string{"pool": "green"})
	e.mkNode(t, "worker-3", true, false, nil)  // Ready, no agent
	e.mkNode(t, "worker-4", true, true, nil)   // cordoned, no agent
	e.mkNode(t, "worker-5", false, false, nil) // NotReady, agent not ready
	e.mkAgent(t, "agent-1", "worker-1", "198.18.0.1", true)
	e.mkAgent(t, "agent-2", "worker-2", "198.18.0.2", true)
	e.mkAgent(t, "agent-5", "worker-5", "198.18.0.5", false)
	d, err := NewDiscovery(e.cs, DefaultDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `node worker-1 ready=true schedulable=true agent=198.18.0.1:9443 pod=agent-1
node worker-2 ready=true schedulable=true agent=198.18.0.2:9443 pod=agent-2
node worker-3 ready=true schedulable=true no-agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
node worker-4 ready=true schedulable=false no-agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
node worker-5 ready=false schedulable=true no-agent: pod cutover/agent-5 is not Ready (ContainersNotReady)
agent worker-1 198.18.0.1:9443 pool=blue
agent worker-2 198.18.0.2:9443 pool=green
problem: node worker-3 is Ready but has no ready cutover agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
`
	if got := r.String(); got != want {
		t.Fatalf("discovery:\n%s\nwant:\n%s", got, want)
	}
	inv, err := d.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Subsets by node label, as coordctl --selector pool=blue picks them.
	cfg := DefaultDiscovery()
	cfg.NodeSelector = "pool=blue"
	blue, _ := NewDiscovery(e.cs, cfg)
	if probs, err := blue.Preflight(ctx, inv, []string{"worker-1"}); err != nil || len(probs) != 0 {
		t.Errorf("pool=blue preflight: %v %q", err, probs)
	}
	// worker-3's agent comes up: no problem left.
	e.mkAgent(t, "agent-3", "worker-3", "198.18.0.3", true)
	probs, err := d.Preflight(ctx, inv, []string{"worker-1", "worker-2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || !strings.HasPrefix(probs[0], "node worker-3 has a ready cutover agent at 198.18.0.3:9443 that appeared while this plan ran") {
		t.Errorf("problems %q", probs)
	}
	// worker-1's agent turns unready: preflight names the node.
	p, _ := e.admin.CoreV1().Pods(ns).Get(ctx, "agent-1", metav1.GetOptions{})
	e.setAgentReady(t, p, "198.18.0.1", false)
	probs, _ = d.Preflight(ctx, inv, []string{"worker-1", "worker-2"})
	if !strings.Contains(strings.Join(probs, "\n"), "node worker-1 is Ready but has no ready cutover agent: pod cutover/agent-1 is not Ready (ContainersNotReady)") {
		t.Errorf("problems %q", probs)
	}
}

func (e *env) journal(t *testing.T, ctx context.Context, cs kubernetes.Interface, id string, mut ...func(*JournalConfig)) *Journal {
	t.Helper()
	cfg := DefaultJournal()
	cfg.Name, cfg.Identity = "jt", id
	for _, m := range mut {
		m(&cfg)
	}
	j, err := NewJournal(ctx, cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// testJournalPrune: with the coordinator's own RBAC, the ConfigMap journal
// keeps the newest Keep finished operations and every unfinished one
// (coordinator.Prunable), and touches no other journal's ConfigMaps.
func (e *env) testJournalPrune(t *testing.T) {
	ctx := context.Background()
	other := e.journal(t, ctx, e.cs, "coord-0", func(c *JournalConfig) { c.Name = "jp-other" })
	if err := other.Save(rec("op-other", 1, "done", "succeeded")); err != nil {
		t.Fatal(err)
	}
	j := e.journal(t, ctx, e.cs, "coord-0", func(c *JournalConfig) { c.Name = "jp"; c.Keep = 3 })
	if err := j.Save(rec("op-running", 1, "prepare", "pending")); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 12; i++ {
		id := fmt.Sprintf("op-%02d", i)
		if err := j.Save(rec(id, int64(i), "prepare", "pending")); err != nil {
			t.Fatal(err)
		}
		if err := j.Save(rec(id, int64(i), "done", "succeeded")); err != nil {
			t.Fatal(err)
		}
	}
	list, err := e.admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelJournal + "=jp"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, cm := range list.Items {
		ids = append(ids, cm.Annotations[AnnotOperation])
	}
	slices.Sort(ids)
	if got, want := strings.Join(ids, ","), "op-10,op-11,op-12,op-running"; got != want {
		t.Errorf("ConfigMaps of journal jp hold %s, want %s", got, want)
	}
	if got, err := other.Load(); err != nil || len(got) != 1 {
		t.Errorf("another journal's ConfigMaps: %v %+v", err, got)
	}
}

func (e *env) testJournalConflict(t *testing.T) {
	ctx := context.Background()
	var fenced atomic.Int32
	old := e.journal(t, ctx, e.cs, "coord-0", func(c *JournalConfig) { c.OnConflict = func(error) { fenced.Add(1) }; c.Keep = 1 })
	r := rec("op-J_1", 1, "prepare", "pending")
	if err := old.Save(r); err != nil {
		t.Fatal(err)
	}
	nu := e.journal(t, ctx, e.cs, "coord-1")
	if got, err := nu.Load(); err != nil || len(got) != 1 || got[0].Step != "prepare" {
		t.Fatalf("load: %v %+v", err, got)
	}
	r.Step = "abort"
	if err := nu.Save(r); err != nil {
		t.Fatal(err)
	}
	r.Step = "commit"
	if err := old.Save(r); !IsConflict(err) || fenced.Load() != 1 || !strings.Contains(err.Error(), "written by coord-1") {
		t.Fatalf("late write of the old leader: %v (fenced %d)", err, fenced.Load())
	}
	got, _ := nu.Load()
	if got[0].Step != "abort" || got[0].CommitSent {
		t.Fatalf("the old leader's write went through: %+v", got[0])
	}
	// Pruning with preconditions on the real apiserver: Keep=1.
	for i, id := range []string{"op-a", "op-b"} {
		if err := old.Save(rec(id, int64(10+i), "done", "succeeded")); err != nil {
			t.Fatal(err)
		}
	}
	got, _ = nu.Load()
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if strings.Join(ids, ",") != "op-J_1,op-b" {
		t.Errorf("after prune: %v", ids)
	}
}

const calicoCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: felixconfigurations.crd.projectcalico.org
spec:
  group: crd.projectcalico.org
  names: {kind: FelixConfiguration, listKind: FelixConfigurationList, plural: felixconfigurations, singular: felixconfiguration}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
            properties:
              vxlanPort: {type: integer}
              vxlanEnabled: {type: boolean}
`

func (e *env) testCalico(t *testing.T) {
	ctx := context.Background()
	if err := e.c.Apply(ctx, []byte(calicoCRD), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(e.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	fc := felix(map[string]any{"vxlanEnabled": true, "logSeverityScreen": "Info"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = adminDyn.Resource(FelixConfigurations).Create(ctx, fc, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the CRD is being established
	}
	if err != nil {
		t.Fatal(err)
	}
	c := NewCalico(e.dyn)
	if msg, err := CheckSourceOfTruth(ctx, c, 4789); err != nil || !strings.HasSuffix(msg, "which matches the current port") {
		t.Fatalf("check: %q %v", msg, err)
	}
	if err := c.Update(ctx, 4889); err != nil {
		t.Fatal(err)
	}
	u, err := adminDyn.Resource(FelixConfigurations).Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port, _, _ := unstructured.NestedInt64(u.Object, "spec", "vxlanPort")
	sev, _, _ := unstructured.NestedString(u.Object, "spec", "logSeverityScreen")
	if port != 4889 || sev != "Info" {
		t.Errorf("read back spec %v", u.Object["spec"])
	}
	if _, err := CheckSourceOfTruth(ctx, c, 4789); err == nil || !strings.Contains(err.Error(), "has spec.vxlanPort 4889 but the agents read back port 4789") {
		t.Errorf("mismatch: %v", err)
	}
	if err := c.Restore(ctx, 4789); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Port(ctx); p != 4789 {
		t.Errorf("after restore: %d", p)
	}
}

func (e *env) testFlannel(t *testing.T) {
	ctx := context.Background()
	ensureNamespace(t, e.admin, "kube-flannel")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel-cfg", Namespace: "kube-flannel"},
		Data: map[string]string{"net-conf.json": upstreamNetConf, "cni-conf.json": `{"name":"cbr0","cniVersion":"0.3.1"}`}}
	if _, err := e.admin.CoreV1().ConfigMaps("kube-flannel").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := NewFlannel(e.cs, "kube-flannel")
	msg, err := CheckSourceOfTruth(ctx, f, 8472)
	if want := "flannel ConfigMap kube-flannel/kube-flannel-cfg has no Backend.Port (flannel's default 8472) which matches the current port"; err != nil || msg != want {
		t.Fatalf("check: %q %v", msg, err)
	}
	if err := f.Update(ctx, 4889); err != nil {
		t.Fatal(err)
	}
	got, err := e.admin.CoreV1().ConfigMaps("kube-flannel").Get(ctx, "kube-flannel-cfg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(upstreamNetConf, `"Type": "vxlan"`, `"Type": "vxlan",`+"\n    \"Port\": 4889", 1)
	if got.Data["net-conf.json"] != want || got.Data["cni-conf.json"] != cm.Data["cni-conf.json"] {
		t.Errorf("read back:\n%s\nwant:\n%s", got.Data["net-conf.json"], want)
	}
	if err := f.Restore(ctx, 8472); err != nil {
		t.Fatal(err)
	}
	if p, _ := f.Port(ctx); p != 8472 {
		t.Errorf("after restore %d", p)
	}
}

// partition wraps a rest.Config so its requests can be cut off: a leader
// that can no longer reach the apiserver, while the process lives on.
type partition struct {
	cut atomic.Bool
	rt  http.RoundTripper
}

func (p *partition) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.cut.Load() {
		return nil, errors.New("partitioned by the test")
	}
	return p.rt.RoundTrip(r)
}

func partitioned(t *testing.T, cfg *rest.Config) (kubernetes.Interface, *partition) {
	c := rest.CopyConfig(cfg)
	p := &partition{}
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { p.rt = rt; return p }
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return cs, p
}

// testHandOver: coordinator A leads and journals an operation up to a
// sent commit, then is partitioned from the apiserver mid-operation. Its
// lease expires, B takes over, resumes the operation from A's journal and
// finishes it (finalize updates flannel's ConfigMap). A's context was
// cancelled when it lost the lease, and a late write from A is refused.
// The operation steps are driven by the test in place of the coordinator
// runtime (which has no journal seam yet), with the same Record type.
func (e *env) testHandOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaderCfg := func(id string) LeaderConfig {
		c := DefaultLeader()
		c.Identity = id
		c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
		return c
	}
	aCS, aNet := partitioned(t, e.sa)
	ref := LeaseRef(ctx, e.cs, ns, "cutover-coordinator")
	recA := NewRecorder(aCS, ref, "coord-a", nil)
	defer recA.Close()

	var aLate error
	aInFlight, aStopped := make(chan struct{}), make(chan time.Time, 1)
	electA, err := NewElector(aCS, leaderCfg("coord-a"), func(lctx context.Context) {
		j, err := NewJournal(lctx, aCS, JournalConfig{Namespace: ns, Name: "ho", Identity: "coord-a", Keep: 5, Timeout: 2 * time.Second})
		if err != nil {
			t.Error(err)
			return
		}
		store := WithMilestones(j, recA)
		r := coordinator.Record{ID: "op-handover", Kind: "cutover", FromPort: 8472, ToPort: 4889, Nodes: []string{"worker-1", "worker-2"},
			StepMillis: 5000, Outcome: "pending", Seq: 1}
		for _, step := range []string{"preflight", "prepare", "commit"} {
			r.Step, r.CommitSent = step, step == "commit"
			if err := store.Save(r); err != nil {
				t.Errorf("A save %s: %v", step, err)
				return
			}
		}
		recA.Close() // let the Events reach the apiserver before the partition
		close(aInFlight)
		<-lctx.Done() // "waiting for commit answers" until the lease is lost
		aStopped <- time.Now()
		r.Step = "rollback"
		aLate = store.Save(r)
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- electA.Run(ctx) }()
	select {
	case <-aInFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("A never led")
	}

	recB := NewRecorder(e.cs, ref, "coord-b", nil)
	var resumed coordinator.Record
	var bStarted time.Time
	bDone := make(chan struct{})
	electB, err := NewElector(e.cs, leaderCfg("coord-b"), func(lctx context.Context) {
		defer close(bDone)
		bStarted = time.Now()
		j, err := NewJournal(lctx, e.cs, JournalConfig{Namespace: ns, Name: "ho", Identity: "coord-b", Keep: 5, Timeout: 5 * time.Second})
		if err != nil {
			t.Error(err)
			return
		}
		store := WithMilestones(j, recB)
		recs, err := store.Load()
		if err != nil || len(recs) != 1 || recs[0].Terminal() {
			t.Errorf("B load: %v %+v", err, recs)
			return
		}
		r := recs[0]
		resumed = r
		// Resume as the coordinator does with commit sent and every agent
		// committed: verify, confirm, finalize (source of truth), done.
		for _, step := range []string{"verify", "confirm", "finalize"} {
			r.Step = step
			if err := store.Save(r); err != nil {
				t.Errorf("B save %s: %v", step, err)
				return
			}
		}
		if err := NewFlannel(e.cs, "kube-flannel").Update(lctx, r.ToPort); err != nil {
			t.Error(err)
		}
		r.Step, r.Outcome = "done", "succeeded"
		if err := store.Save(r); err != nil {
			t.Errorf("B save done: %v", err)
		}
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bRun := make(chan error, 1)
	go func() { bRun <- electB.Run(ctx) }()
	time.Sleep(time.Second)
	if electB.IsLeader() {
		t.Fatal("B leads while A holds the lease")
	}

	cut := time.Now()
	aNet.cut.Store(true)
	var stoppedAt time.Time
	select {
	case stoppedAt = <-aStopped:
	case <-time.After(30 * time.Second):
		t.Fatal("A's context was not cancelled after it lost the apiserver")
	}
	if err := <-aDone; !errors.Is(err, ErrLeaseLost) {
		t.Errorf("A's Run = %v, want ErrLeaseLost", err)
	}
	if aLate == nil {
		t.Error("A journaled after losing the lease")
	}
	select {
	case <-bDone:
	case <-time.After(60 * time.Second):
		t.Fatal("B never took over")
	}
	t.Logf("A stopped %s after the partition; B finished the operation %s after it", stoppedAt.Sub(cut).Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
	recB.Close()
	// The old leader stops before the new one starts: its renew deadline
	// is shorter than the lease the new one waits out.
	if !stoppedAt.Before(bStarted) {
		t.Errorf("A stopped at %s, after B started leading at %s", stoppedAt, bStarted)
	}

	if resumed.Step != "commit" || !resumed.CommitSent {
		t.Errorf("B resumed from %+v, want A's commit step", resumed)
	}
	// Read everything back from the apiserver.
	l, err := e.admin.CoordinationV1().Leases(ns).Get(ctx, "cutover-coordinator", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "coord-b" {
		t.Errorf("lease: %v %+v", err, l.Spec)
	}
	jr := e.journal(t, ctx, e.admin, "reader", func(c *JournalConfig) { c.Name = "ho" })
	recs, err := jr.Load()
	if err != nil || len(recs) != 1 || recs[0].Outcome != "succeeded" || recs[0].Step != "done" {
		t.Errorf("journal: %v %+v", err, recs)
	}
	cm, _ := e.admin.CoreV1().ConfigMaps(ns).Get(ctx, jr.ConfigMapName("op-handover"), metav1.GetOptions{})
	if cm.Annotations[AnnotWriter] != "coord-b" {
		t.Errorf("last writer %q", cm.Annotations[AnnotWriter])
	}
	if p, _ := NewFlannel(e.admin, "kube-flannel").Port(ctx); p != 4889 {
		t.Errorf("flannel port after finalize: %d", p)
	}
	evs, err := e.admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=cutover-coordinator"})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(evs.Items, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
	var got []string
	for _, ev := range evs.Items {
		got = append(got, ev.ReportingInstance+" "+ev.Reason)
	}
	want := "coord-a OperationStarted,coord-a OperationPrepared,coord-b OperationCommitted,coord-b OperationConfirmed,coord-b OperationSucceeded"
	if strings.Join(got, ",") != want {
		t.Errorf("events %v\nwant %s", got, want)
	}
}

// testSession runs Run as the coordinator binary would: leadership, a
// session over discovery, the journal and flannel, then a lead function
// that returns, which must give the Lease up.
func (e *env) testSession(t *testing.T) {
	ctx := context.Background()
	cfg := Default()
	cfg.Leader.Namespace, cfg.Leader.Name, cfg.Leader.Identity = ns, "session-test", "coord-s"
	cfg.Journal.Name = "session"
	cfg.CNI = "flannel"
	var sawNodes []string
	var probs []string
	err := Run(ctx, e.sa, cfg, func(lctx context.Context, s *Session) error {
		for _, a := range s.Inventory.Agents {
			sawNodes = append(sawNodes, a.Node)
		}
		op := coordinator.OpInfo{ID: "op-s", Kind: "cutover", FromPort: 8472, ToPort: 4999, Nodes: []string{"worker-2"}}
		probs = s.Preflight(lctx, op)
		if err := s.BeforeCommit(lctx, op); err != nil {
			return err
		}
		if p, _ := s.Source.Port(lctx); p != 4999 {
			t.Errorf("after BeforeCommit: %d", p)
		}
		if err := s.Finalize(lctx, op); err != nil {
			t.Errorf("Finalize: %v", err)
		}
		if err := s.Restore(lctx, op); err != nil {
			return err
		}
		return s.Journal.Save(rec("op-s", 1, "done", "succeeded"))
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// worker-1's agent was made unready by the Discovery test.
	if strings.Join(sawNodes, ",") != "worker-2,worker-3" {
		t.Errorf("inventory %v", sawNodes)
	}
	if len(probs) != 1 || !strings.HasPrefix(probs[0], "node worker-1 is Ready but has no ready cutover agent") {
		t.Errorf("preflight %q", probs)
	}
	if p, _ := NewFlannel(e.admin, "kube-flannel").Port(ctx); p != 8472 {
		t.Errorf("flannel after Restore: %d", p)
	}
	l, err := e.admin.CoordinationV1().Leases(ns).Get(ctx, "session-test", metav1.GetOptions{})
	if err != nil || (l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "") {
		t.Errorf("lease not released: %v %v", err, l.Spec.HolderIdentity)
	}
	if cfg.CNI = "weave"; cfg.Validate() == nil {
		t.Error("--cni weave accepted")
	}
}
