package replica

// The coordinator's cluster mode end to end against a real kube-apiserver
// (harness/kubetest): two replicas through the same code path as --kube
// (New/Run, as the coordinator's ServiceAccount with deploy/'s
// RBAC), fake agents over bufconn at the host IPs discovery finds, and a
// leader cut off from the apiserver with an operation in flight.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const ns = "cutover"

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

// installRBAC applies the namespaces, ServiceAccounts and RBAC of
// deploy/overlays/full, so the replicas run with exactly the shipped rights.
func installRBAC(t *testing.T, c *kubetest.Cluster, admin kubernetes.Interface) {
	objs, err := kubetest.DecodeYAML(kubetest.Kustomize(t, filepath.Join(repoRoot(), "deploy", "overlays", "full")))
	if err != nil {
		t.Fatal(err)
	}
	var rbac []byte
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			if o.GetNamespace() != "" {
				ensureNamespace(t, admin, o.GetNamespace())
			}
			b, err := json.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			rbac = append(append(rbac, b...), "\n---\n"...)
		}
	}
	if err := c.Apply(context.Background(), rbac, kubetest.ApplyOptions{}); err != nil {
		t.Fatalf("RBAC from deploy/overlays/full: %v", err)
	}
}

func ensureNamespace(t *testing.T, cs kubernetes.Interface, name string) {
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// mkReadyNode creates node with the Ready condition a kubelet would set.
func mkReadyNode(t *testing.T, admin kubernetes.Interface, node string) {
	t.Helper()
	ctx := context.Background()
	n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// mkNodeWithAgent creates a Ready node and a Ready agent pod on it at
// hostIP, with the statuses a kubelet would set.
func mkNodeWithAgent(t *testing.T, admin kubernetes.Interface, node, hostIP string) {
	ctx := context.Background()
	mkReadyNode(t, admin, node)
	p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node, Labels: map[string]string{"app.kubernetes.io/name": "cutover-agent"}},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "cutover/agent:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP, p.Status.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	p.Status.PodIP, p.Status.PodIPs = hostIP, []corev1.PodIP{{IP: hostIP}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func mkCoordinatorPod(t *testing.T, admin kubernetes.Interface, name, ip string) {
	ctx := context.Background()
	p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "cutover-coordinator"}},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "coordinator", Image: "cutover/coordinator:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// sharedPort returns a TCP port free on 127.0.0.1: the replicas listen on
// it at 127.0.0.2, .3, .4 (one port for all, as in a Deployment).
func sharedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// partition cuts a replica off the apiserver while its process lives on:
// every client built from the replica's config goes through it. readOnly
// refuses only its writes: it can read the leader lock but never take it.
type partition struct{ cut, readOnly atomic.Bool }

type cutRT struct {
	p  *partition
	rt http.RoundTripper
}

func (c cutRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.p.cut.Load() {
		return nil, errors.New("partitioned by the test")
	}
	if c.p.readOnly.Load() && r.Method != http.MethodGet {
		return nil, fmt.Errorf("%s refused by the test: read-only", r.Method)
	}
	return c.rt.RoundTrip(r)
}

type replica struct {
	id   string
	p    *Replica
	net  *partition
	done chan error
	api  coordinatorv1.CoordinatorServiceClient
	http string
}

// startReplica runs replica id with its API on listen (host:port, as its
// pod's IP would give it) and creates its pod, Running at that IP, so a
// standby finds the leader's address as it does in a cluster.
func startReplica(t *testing.T, ctx context.Context, admin kubernetes.Interface, sa *rest.Config, id, listen string, dial grpc.DialOption, opts ...func(*kube.Config)) *replica {
	r := newReplica(t, admin, sa, id, listen, dial, opts...)
	r.start(ctx)
	return r
}

// newReplica is startReplica without the start, for a test that sets up
// the replica's partition first.
func newReplica(t *testing.T, admin kubernetes.Interface, sa *rest.Config, id, listen string, dial grpc.DialOption, opts ...func(*kube.Config)) *replica {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatal(err)
	}
	mkCoordinatorPod(t, admin, id, host)
	cfg := coordinator.Default()
	cfg.Listen, cfg.MetricsListen = listen, host+":0"
	cfg.Insecure = true
	// A step outlasts the renew deadline (3 s): the hanging Commit is
	// still in flight when the Lease is lost, not timed out before.
	cfg.StepTimeout, cfg.Deadman = 8*time.Second, 20*time.Second
	kcfg := kube.Default()
	kcfg.Discovery.Namespace, kcfg.Leader.Namespace = ns, ns
	kcfg.Leader.Identity = id
	kcfg.Leader.LeaseDuration, kcfg.Leader.RenewDeadline, kcfg.Leader.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	kcfg.Journal.Timeout = 2 * time.Second
	kcfg.CNI, kcfg.FlannelNamespace = "flannel", "kube-flannel"
	for _, o := range opts {
		o(&kcfg)
	}
	r := &replica{id: id, net: &partition{}, done: make(chan error, 1)}
	rc := rest.CopyConfig(sa)
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cutRT{r.net, rt} }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(&tlog{t, id}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	p, err := New(cfg, kcfg, rc, log, coordinator.WithDialOptions(dial, grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	addrs := p.srv.Addrs()
	cc, err := grpc.NewClient("passthrough:///"+addrs[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	r.api = coordinatorv1.NewCoordinatorServiceClient(cc)
	r.http = "http://" + addrs[1].String()
	return r
}

func (r *replica) start(ctx context.Context) { go func() { r.done <- r.p.Run(ctx) }() }

type tlog struct {
	t  *testing.T
	id string
}

func (l *tlog) Write(b []byte) (int, error) {
	l.t.Logf("%s: %s", l.id, strings.TrimSpace(string(b)))
	return len(b), nil
}

func (r *replica) readyz() (int, string) {
	resp, err := http.Get(r.http + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitFor(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterHandOver: replica A leads and runs a cutover 8472→4889 on
// three nodes; every agent is prepared, A's BeforeCommit moves flannel's
// ConfigMap to 4889, n1 and n3 commit, n2's Commit hangs. A is then cut
// off the apiserver: it loses the Lease, its calls to the agents stop
// (n2 never applies). B takes over, resumes from the ConfigMap journal:
// commit was sent but n2 is not committed, so it rolls everyone back and
// calls Restore, which A's journaled BeforeCommit calls for: every agent
// and flannel's ConfigMap end on 8472 (I1).
func TestClusterHandOver(t *testing.T) {
	c := kubetest.Start(t)
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	installRBAC(t, c, admin)
	ensureNamespace(t, admin, "kube-flannel")
	netConf := "{\n  \"Network\": \"198.19.0.0/16\",\n  \"Backend\": {\n    \"Type\": \"vxlan\"\n  }\n}\n"
	if _, err := admin.CoreV1().ConfigMaps("kube-flannel").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel-cfg"},
		Data: map[string]string{"net-conf.json": netConf}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	flannelPort := func() tunnelport.Port {
		p, err := kube.NewFlannel(admin, "kube-flannel").Port(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	// Fake agents at the host IPs the pods report.
	fakes := map[string]*fakeagent.Agent{}
	lis := map[string]*bufconn.Listener{}
	for i, node := range []string{"n1", "n2", "n3"} {
		ip := fmt.Sprintf("198.18.0.%d", i+1)
		mkNodeWithAgent(t, admin, node, ip)
		f := fakeagent.New(node, 8472)
		l := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		fakeagent.Register(s, f)
		go func() { _ = s.Serve(l) }()
		t.Cleanup(s.Stop)
		fakes[node], lis[ip+":9443"] = f, l
	}
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no test agent at %s", addr)
	})
	dump := func() string {
		var s []string
		for _, n := range []string{"n1", "n2", "n3"} {
			s = append(s, fakes[n].Dump())
		}
		return strings.Join(s, "\n")
	}

	sa := c.ServiceAccount(ns, "cutover-coordinator")
	port := sharedPort(t)
	a := startReplica(t, ctx, admin, sa, "coord-a", "127.0.0.2:"+port, dial)
	waitFor(t, "A to lead and be ready", 30*time.Second, func() bool { code, _ := a.readyz(); return code == http.StatusOK })
	b := startReplica(t, ctx, admin, sa, "coord-b", "127.0.0.3:"+port, dial)
	// The standby is Ready (a rolling update of the Deployment
	// needs both replicas Ready to complete) and serves the API by
	// forwarding to the leader it finds from the Lease and A's pod.
	waitFor(t, "B ready as a standby", 10*time.Second, func() bool { code, _ := b.readyz(); return code == http.StatusOK })
	var agents *coordinatorv1.ListAgentsResponse
	waitFor(t, "B to forward ListAgents to A", 10*time.Second, func() bool {
		agents, err = b.api.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{})
		return err == nil
	})
	if len(agents.GetAgents()) != 3 {
		t.Errorf("ListAgents through standby B: %v", agents)
	}
	if pr, err := b.api.Plan(ctx, &coordinatorv1.CutoverRequest{Port: 4889}); err != nil || len(pr.GetProblems()) != 0 {
		t.Errorf("Plan through standby B: %v %v", pr, err)
	}

	// A runs the cutover; n2's Commit hangs until A's calls are cancelled.
	fakes["n2"].SetFault("Commit", fakeagent.Fault{Delay: time.Minute})
	st, err := a.api.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op-ho"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	waitFor(t, "n1 and n3 committed, n2 in Commit", 15*time.Second, func() bool {
		return strings.Contains(fakes["n1"].Dump(), "COMMITTED") && strings.Contains(fakes["n3"].Dump(), "COMMITTED") && fakes["n2"].Called("Commit")
	})
	if p := flannelPort(); p != 4889 {
		t.Fatalf("flannel ConfigMap before the commit: %d, want 4889 (BeforeCommit)", p)
	}

	cut := time.Now()
	a.net.cut.Store(true)
	select {
	case err := <-a.done:
		if !errors.Is(err, kube.ErrLeaseLost) {
			t.Errorf("A's Run = %v, want ErrLeaseLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("A did not stop after losing the apiserver")
	}
	aStopped := time.Since(cut)
	if fakes["n2"].Port() != 8472 {
		t.Errorf("n2 applied A's commit after A lost the Lease: %s", fakes["n2"].Dump())
	}
	fakes["n2"].SetFault("Commit", fakeagent.Fault{})

	var rep *coordinatorv1.Report
	waitFor(t, "B to lead and finish op-ho", 30*time.Second, func() bool {
		r, err := b.api.Status(ctx, &coordinatorv1.StatusRequest{OperationId: "op-ho"})
		rep = r
		return err == nil && r.State != coordinatorv1.OperationState_OPERATION_STATE_RUNNING
	})
	t.Logf("A stopped %s after the partition; B ended op-ho %s after it (%s); whole test %s",
		aStopped.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond), rep.State, time.Since(start).Round(time.Millisecond))
	if rep.State != coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK {
		t.Fatalf("op-ho: %s %q", rep.State, rep.Error)
	}
	// I1, read back from the agents; the source of truth agrees with them.
	want := "n1 port=8472 op=op-ho phase=REVERTED\nn2 port=8472 op=op-ho phase=ABORTED\nn3 port=8472 op=op-ho phase=REVERTED"
	if got := dump(); got != want {
		t.Errorf("agents:\n%s\nwant:\n%s", got, want)
	}
	if p := flannelPort(); p != 8472 {
		t.Errorf("flannel ConfigMap after the rollback: %d, want 8472 (Restore)", p)
	}
	// The journal, read back from the apiserver: A's BeforeCommit, B's
	// Restore, B wrote last.
	jc := kube.DefaultJournal()
	jc.Namespace, jc.Identity = ns, "reader"
	j, err := kube.NewJournal(ctx, admin, jc)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := j.Load()
	if err != nil || len(recs) != 1 {
		t.Fatalf("journal: %v %+v", err, recs)
	}
	var marks []string
	for _, m := range recs[0].Hooks {
		marks = append(marks, m.Hook+" "+m.Point+" "+m.State)
	}
	if got := strings.Join(marks, ", "); got != "cluster before-commit done, cluster restore done" {
		t.Errorf("journal hooks: %s", got)
	}
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, j.ConfigMapName("op-ho"), metav1.GetOptions{})
	if err != nil || cm.Annotations[kube.AnnotWriter] != "coord-b" {
		t.Errorf("last journal writer: %v %v", err, cm.GetAnnotations())
	}
	// Ready once B's cached view of the leader caught up (it rereads the
	// Lease at most once a second): a CI run read 503 right after the
	// take-over. A kubelet probes again; so does the test, for 5 s.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := b.readyz()
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("B /readyz 5 s after taking over: %d %s", code, body)
			break
		}
	}
	// B serves the API: the operation's rollback of a rolled-back
	// operation has nothing to do; a new cutover works under B.
	rep2, err := b.api.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op-b"})
	if err != nil {
		t.Fatal(err)
	}
	last := lastEvent(rep2)
	if last.GetReport().GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("op-b under B: %v", last)
	}
	if p := flannelPort(); p != 4889 {
		t.Errorf("flannel ConfigMap after op-b: %d", p)
	}

	// A new standby (A's replacement in a rolling update) forwards an
	// operation stream to B, event by event, final report included.
	d := startReplica(t, ctx, admin, sa, "coord-d", "127.0.0.4:"+port, dial)
	waitFor(t, "D ready as a standby", 10*time.Second, func() bool { code, _ := d.readyz(); return code == http.StatusOK })
	var events []*coordinatorv1.OperationEvent
	var lastErr error
	waitFor(t, "op-d through standby D", 15*time.Second, func() bool {
		st, err := d.api.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4999, OperationId: "op-d"})
		if err != nil {
			lastErr = err
			return false
		}
		events = nil
		for {
			ev, err := st.Recv()
			if err != nil {
				lastErr = err
				if status.Code(err) == codes.Unavailable {
					time.Sleep(200 * time.Millisecond)
				}
				return len(events) > 0 && (errors.Is(err, io.EOF) || status.Code(err) != codes.Unavailable)
			}
			events = append(events, ev)
		}
	})
	t.Logf("op-d through D: %d events, stream ended with %v", len(events), lastErr)
	if n := len(events); n < 2 || events[n-1].GetReport().GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("op-d through D: %d events, last %v", n, events[len(events)-1])
	}
	if got := dump(); !strings.Contains(got, "n1 port=4999 op=op-d") {
		t.Errorf("agents after op-d through D:\n%s", got)
	}
	// One hop only: a call a standby forwarded is not forwarded again.
	_, err = d.api.Status(metadata.AppendToOutgoingContext(ctx, "cutover-forwarded-by", "coord-x"), &coordinatorv1.StatusRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "forwarded here by coord-x") {
		t.Errorf("a forwarded call reaching a standby: %v, want UNAVAILABLE naming coord-x", err)
	}
	cancel()
	select {
	case err := <-b.done:
		if err != nil {
			t.Errorf("B's Run at shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("B did not stop")
	}
}

// TestClusterInventoryFollows is the cluster half of subset safety: a node that
// joins after the leader started is in the next plan. Without a ready
// agent it is a problem by name (the cutover would leave it on the old
// port, cut off from the rest); once its agent is ready, plan passes with
// it included and a cutover moves it with the others.
func TestClusterInventoryFollows(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	installRBAC(t, c, admin)
	ensureNamespace(t, admin, "kube-flannel")
	if _, err := admin.CoreV1().ConfigMaps("kube-flannel").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel-cfg"},
		Data: map[string]string{"net-conf.json": `{"Network": "198.19.0.0/16", "Backend": {"Type": "vxlan"}}`}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fakes := map[string]*fakeagent.Agent{}
	lis := map[string]*bufconn.Listener{}
	serve := func(node, ip string) {
		f := fakeagent.New(node, 8472)
		l := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		fakeagent.Register(s, f)
		go func() { _ = s.Serve(l) }()
		t.Cleanup(s.Stop)
		fakes[node], lis[ip+":9443"] = f, l
	}
	for i, node := range []string{"n1", "n2"} {
		ip := fmt.Sprintf("198.18.0.%d", i+1)
		mkNodeWithAgent(t, admin, node, ip)
		serve(node, ip)
	}
	serve("n3", "198.18.0.3") // listening before its pod exists; found only through the pod
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no test agent at %s", addr)
	})
	a := startReplica(t, ctx, admin, c.ServiceAccount(ns, "cutover-coordinator"), "coord-a", "127.0.0.2:"+sharedPort(t), dial)
	// Ready is not leading (a standby is Ready too): wait until A answers
	// the API itself, which a standby with no leader yet does not.
	waitFor(t, "A to lead", 30*time.Second, func() bool {
		_, err := a.api.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{})
		return err == nil
	})
	plan := func() *coordinatorv1.PlanResponse {
		t.Helper()
		p, err := a.api.Plan(ctx, &coordinatorv1.CutoverRequest{Port: 4889})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := plan(); len(p.Problems) != 0 || len(p.Nodes) != 2 {
		t.Fatalf("plan before n3 joined: %v", p)
	}

	// n3 joins after the leader started: Ready, its agent pod Pending.
	mkReadyNode(t, admin, "n3")
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-n3", Labels: map[string]string{"app.kubernetes.io/name": "cutover-agent"}},
		Spec: corev1.PodSpec{NodeName: "n3", HostNetwork: true, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "cutover/agent:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodPending
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := plan()
	const want = "cluster: node n3 is Ready but has no ready cutover agent: pod cutover/agent-n3 is Pending, not Running"
	if !slices.Contains(p.Problems, want) {
		t.Fatalf("plan with n3's agent Pending: problems %q, want %q", p.Problems, want)
	}
	st, err := a.api.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889})
	for err == nil {
		// Preflight's progress events may come first; the refusal ends
		// the stream.
		_, err = st.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node n3 is Ready but has no ready cutover agent") {
		t.Fatalf("cutover with n3's agent Pending: %v", err)
	}
	for n, f := range fakes {
		if f.Called("Prepare") {
			t.Errorf("%s prepared although preflight had a problem", n)
		}
	}

	// Its agent becomes ready: plan passes with n3, the cutover moves it.
	pod, err = admin.CoreV1().Pods(ns).Get(ctx, "agent-n3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP, pod.Status.HostIPs = "198.18.0.3", []corev1.HostIP{{IP: "198.18.0.3"}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = plan()
	if len(p.Problems) != 0 || len(p.Nodes) != 3 || p.Nodes[2].Node != "n3" {
		t.Fatalf("plan with n3 ready: %v", p)
	}
	st, err = a.api.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: 4889, OperationId: "op-n3"})
	if err != nil {
		t.Fatal(err)
	}
	last := lastEvent(st)
	if last.GetReport().GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("op-n3: %v", last)
	}
	for n, f := range fakes {
		if f.Port() != 4889 {
			t.Errorf("%s on %d after the cutover (I1)", n, f.Port())
		}
	}
}

// lastEvent reads an operation stream to its end and returns its last event.
func lastEvent(st grpc.ServerStreamingClient[coordinatorv1.OperationEvent]) *coordinatorv1.OperationEvent {
	var last *coordinatorv1.OperationEvent
	for {
		ev, err := st.Recv()
		if err != nil {
			return last
		}
		last = ev
	}
}
