package openshift

// End-to-end: a 3-node OVS lab (harness/lab) with the real agent binary
// (--profile openshift-sdn), an openshift-sdn stand-in per node
// (harness/sdnsim) reading the ClusterNetwork from a real kube-apiserver, the
// real coordinator in this process (its agents reached through the lab's
// hub namespace) with or without the hook, and a cutover 4789 → 4889.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/sdnsim"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

const (
	image       = "registry.example/openshift3/ose-node:v3.11"
	customImage = "registry.example/openshift3/ose-node:v3.11-custom"
	triggers    = `[{"from":{"kind":"ImageStreamTag","name":"node:v3.11"},"fieldPath":"spec.template.spec.containers[?(@.name==\"sdn\")].image"}]`
)

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "cot-osdn-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./agent/cmd/agent", "./coordinator/cmd/coordinator", "./harness/sdnsim/cmd/sdnsim")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type env struct {
	kc  *kubetest.Cluster
	cs  kubernetes.Interface
	dyn dynamic.Interface
}

func (e env) resetAPI(t *testing.T, ctx context.Context) {
	t.Helper()
	zero := int64(0)
	_ = e.cs.AppsV1().DaemonSets(sdnsim.Namespace).Delete(ctx, sdnsim.DaemonSetName, metav1.DeleteOptions{})
	_ = e.cs.CoreV1().Pods(sdnsim.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	_ = e.cs.CoreV1().ConfigMaps(sdnsim.Namespace).Delete(ctx, "cutover-sdn-saved", metav1.DeleteOptions{})
	_ = e.dyn.Resource(ClusterNetworkGVR).Delete(ctx, "default", metav1.DeleteOptions{})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := e.dyn.Resource(ClusterNetworkGVR).Create(ctx, sdnsim.NewClusterNetwork(4789, "198.19.0.0/16"), metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("create ClusterNetwork: %v", err)
		}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: sdnsim.DaemonSetName, Namespace: sdnsim.Namespace, Annotations: map[string]string{TriggersAnnotation: triggers}},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "sdn"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "sdn"}},
				Spec:       corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{{Name: "sdn", Image: image}}},
			},
		},
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := e.cs.AppsV1().DaemonSets(sdnsim.Namespace).Create(ctx, ds, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("create DaemonSet: %v", err)
		}
	}
}

func startAPI(t *testing.T) env {
	kc := kubetest.Start(t)
	ctx := context.Background()
	cs, err := kc.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kc.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.Apply(ctx, []byte(sdnsim.ClusterNetworkCRD), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sdnsim.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default ServiceAccount (no controller
	// manager runs to create it).
	if _, err := cs.CoreV1().ServiceAccounts(sdnsim.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return env{kc: kc, cs: cs, dyn: dyn}
}

type rig struct {
	l        *lab.Lab
	sup      *sdnsim.Supervisor
	interval time.Duration
}

func upLab(t *testing.T, ctx context.Context, e env, interval time.Duration) rig {
	t.Helper()
	bin := binaries(t)
	e.resetAPI(t, ctx)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "osdn" + hex.EncodeToString(b)
	cfg := lab.Config{Name: name, Nodes: 3, Backend: lab.BackendOVS, Dir: filepath.Join(t.TempDir(), "lab"),
		StartProcesses: true, Insecure: true,
		AgentBin: filepath.Join(bin, "agent"), CoordinatorBin: filepath.Join(bin, "coordinator"),
		ExtraAgentArgs: []string{"--profile", "openshift-sdn"}}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Down(context.Background()) })
	sup, err := l.StartSDN(ctx, lab.SDNConfig{Bin: filepath.Join(bin, "sdnsim"), Kubeconfig: e.kc.Kubeconfig, Client: e.cs,
		HealthInterval: interval, NoHealthCheckImages: []string{customImage}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sup.Stop()
		if t.Failed() {
			for _, ev := range sup.Events() {
				t.Log(ev)
			}
		}
	})
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := sup.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	// The first start of each stand-in found no version note and built
	// br0 (a fresh node): let the overlay settle.
	m, err := l.Mesh(ctx, 20*time.Second)
	if err != nil || !m.AllOK() {
		t.Fatalf("mesh after the SDN set the nodes up: %v\n%s", err, m)
	}
	return rig{l: l, sup: sup, interval: interval}
}

// coordinatorFor runs the real coordinator in this process, reaching the
// lab's agents from the hub namespace, with hooks.
func coordinatorFor(t *testing.T, l *lab.Lab, hooks ...coordinator.Hook) coordinatorv1.CoordinatorServiceClient {
	t.Helper()
	var specs []coordinator.AgentSpec
	for _, n := range l.Nodes() {
		specs = append(specs, coordinator.AgentSpec{Node: n.Name, Address: n.AgentAddr})
	}
	inv, err := coordinator.NewInventory("lab", specs)
	if err != nil {
		t.Fatal(err)
	}
	hub := lab.HubNetns(l.Name())
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(hub, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	})
	cfg := coordinator.Default()
	cfg.StateDir = t.TempDir()
	cfg.Insecure = true
	opts := []coordinator.Option{coordinator.WithDialOptions(dial, grpc.WithTransportCredentials(insecure.NewCredentials())),
		coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	for _, h := range hooks {
		opts = append(opts, coordinator.WithHook(h))
	}
	c, err := coordinator.New(cfg, inv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	api := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	coordinator.Serve(s, c)
	go func() { _ = s.Serve(api) }()
	cc, err := grpc.NewClient("passthrough:///coordinator", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return api.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); s.Stop(); c.Close() })
	return coordinatorv1.NewCoordinatorServiceClient(cc)
}

func cutover(t *testing.T, cl coordinatorv1.CoordinatorServiceClient, port uint32) *coordinatorv1.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := cl.Cutover(ctx, &coordinatorv1.CutoverRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatal("stream ended without a report")
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Report != nil {
			return ev.Report
		}
	}
}

func disruption(r *coordinatorv1.Report) string {
	return fmt.Sprintf("probes sent %d lost %d, longest gap %s", r.ProbesSent, r.ProbesLost, time.Duration(r.LongestGapMicros)*time.Microsecond)
}

// count counts events of node containing s.
func count(evs []sdnsim.Event, node, s string) int {
	n := 0
	for _, e := range evs {
		if e.Node == node && strings.Contains(e.What, s) {
			n++
		}
	}
	return n
}

// sdnState reads, on node, the ports in the SDN's chains and br0's drop
// flows, from iptables-save and ovs-ofctl.
func sdnState(t *testing.T, l *lab.Lab, node string) string {
	t.Helper()
	ctx := context.Background()
	save, err := l.Exec(ctx, node, "iptables-save")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(save, "\n") {
		if strings.HasPrefix(line, "-A OPENSHIFT-FIREWALL-ALLOW") || strings.HasPrefix(line, "-A OPENSHIFT-NOTRACK") || strings.HasPrefix(line, "-A OS_FIREWALL_ALLOW") {
			out = append(out, line)
		}
	}
	flows, err := l.OVS(node).Ofctl(ctx, "-O", "OpenFlow13", "dump-flows", "br0", "table=20")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(flows, "\n") {
		if i := strings.Index(f, "priority=300"); i >= 0 {
			out = append(out, f[i:])
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func TestLabOpenShiftSDN(t *testing.T) {
	testenv.RequirePrivileged(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "iptables", "iptables-save", "ip")
	e := startAPI(t)
	ctx := context.Background()

	// Without the coordinator-side profile: the agents move the port (and
	// the SDN's rules), the coordinator verifies and declares success,
	// and then each stand-in's health check finds vxlan0 on a port the
	// ClusterNetwork does not say, exits, is restarted, and rebuilds br0
	// on the old port.
	t.Run("plain", func(t *testing.T) {
		interval := 2 * time.Second
		r := upLab(t, ctx, e, interval)
		cl := coordinatorFor(t, r.l)
		start := time.Now()
		rep := cutover(t, cl, 4889)
		if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
			t.Fatalf("cutover: %v %s", rep.State, rep.Error)
		}
		t.Logf("cutover SUCCEEDED (%s); the coordinator sees nothing wrong", disruption(rep))
		// Wait until every stand-in has been restarted and has finished
		// its rebuild (or the deadline).
		var evs []sdnsim.Event
		var took time.Duration
		for deadline := time.Now().Add(4*interval + 20*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			evs = r.sup.EventsSince(start)
			if count(evs, "n1", "setup=rebuilt") > 0 && count(evs, "n2", "setup=rebuilt") > 0 && count(evs, "n3", "setup=rebuilt") > 0 {
				took = time.Since(start)
				break
			}
		}
		got, _ := r.l.Ports(ctx)
		for _, ev := range evs {
			t.Log(ev)
		}
		if got != "n1=4789 n2=4789 n3=4789" {
			t.Fatalf("nodes after the stand-ins' health checks: %s, want every node rebuilt on 4789", got)
		}
		t.Logf("every node rebuilt back onto 4789 %s after the cutover started (health interval %s)", took.Round(time.Millisecond), interval)
		for _, n := range []string{"n1", "n2", "n3"} {
			if count(evs, n, "health failed") == 0 || count(evs, n, "exit code=2") == 0 || count(evs, n, "start port=4789 setup=rebuilt") == 0 {
				t.Errorf("%s: want health failed, exit code=2, restart with a rebuild on 4789", n)
			}
		}
		stats, err := r.l.ProbeStats(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("probe mesh since the cutover (rebuilds included): %s", lab.Summarize(stats))
		if lab.Summarize(stats).Lost == 0 {
			t.Error("the rebuilds did not show in the probe mesh")
		}
	})

	for _, strategy := range []string{StrategySourceOfTruthFirst, StrategyFieldReport} {
		t.Run(strategy, func(t *testing.T) {
			interval := 5 * time.Second
			r := upLab(t, ctx, e, interval)
			cfg := Config{Client: e.cs, Dynamic: e.dyn, Strategy: strategy, HealthInterval: interval, Out: tlog{t}}
			if strategy == StrategyFieldReport {
				cfg.Image = customImage
			}
			h, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cl := coordinatorFor(t, r.l, h)
			start := time.Now()
			rep := cutover(t, cl, 4889)
			if rep.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
				t.Fatalf("cutover: %v %s", rep.State, rep.Error)
			}
			change := h.Timings.AfterConfirmEnd.Sub(h.Timings.BeforeCommitStart)
			t.Logf("cutover SUCCEEDED: %s; before-commit %s; from before-commit to the last SDN pod ready %s (health interval %s); pod restarts %v",
				disruption(rep), h.Timings.BeforeCommitEnd.Sub(h.Timings.BeforeCommitStart).Round(time.Millisecond),
				change.Round(time.Millisecond), interval, h.Timings.PodRestarts)
			if strategy == StrategySourceOfTruthFirst && change >= interval {
				t.Errorf("the change took %s, not inside the %s health interval", change, interval)
			}
			// Every stand-in has restarted by now; give their health
			// checks more than one interval to disagree.
			time.Sleep(interval + interval/2)
			evs := r.sup.EventsSince(start)
			for _, ev := range evs {
				t.Log(ev)
			}
			if got, _ := r.l.Ports(ctx); got != "n1=4889 n2=4889 n3=4889" {
				t.Fatalf("ports %s, want every node on 4889", got)
			}
			for _, n := range []string{"n1", "n2", "n3"} {
				if c := count(evs, n, "start port=4889 setup=already"); c == 0 {
					t.Errorf("%s: the SDN was not restarted onto 4889 without a rebuild", n)
				}
				if c := count(evs, n, "rebuild"); c != 0 {
					t.Errorf("%s: %d rebuilds", n, c)
				}
				if c := count(evs, n, "health failed on="); c != 0 {
					t.Errorf("%s: %d failed health checks", n, c)
				}
				if c := count(evs, n, "health ok"); c == 0 {
					t.Errorf("%s: no health check ran after the restart", n)
				}
				want := strings.Join([]string{
					`-A OPENSHIFT-FIREWALL-ALLOW -p udp -m udp --dport 4889 -m comment --comment "VXLAN incoming" -j ACCEPT`,
					"-A OPENSHIFT-NOTRACK -p udp -m udp --dport 4889 -j NOTRACK",
					"-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT",
					"priority=300,udp,tp_dst=4889 actions=drop",
				}, "\n")
				if got := sdnState(t, r.l, n); got != want {
					t.Errorf("%s SDN state:\n%s\nwant\n%s", n, got, want)
				}
			}
			if p, err := (&ClusterNetwork{Client: e.dyn}).Port(ctx); err != nil || p != 4889 {
				t.Errorf("ClusterNetwork port %d %v", p, err)
			}
			ds, err := e.cs.AppsV1().DaemonSets(sdnsim.Namespace).Get(ctx, sdnsim.DaemonSetName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if img, _ := containerImage(ds, "sdn"); img != image || ds.Annotations[TriggersAnnotation] != triggers {
				t.Errorf("DaemonSet image %s, triggers %q: not restored", img, ds.Annotations[TriggersAnnotation])
			}
			if _, err := e.cs.CoreV1().ConfigMaps(sdnsim.Namespace).Get(ctx, "cutover-sdn-saved", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("saved-copy ConfigMap left behind: %v", err)
			}
		})
	}
}
