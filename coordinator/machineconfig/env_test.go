package machineconfig

// The Kubernetes tier: a real kube-apiserver (harness/kubetest) with the
// MCO's CRDs (testdata/crds.yaml), nodes played by stand-in daemons
// (harness/mcdsim) and a stand-in kubelet finishing evicted pods.

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/mcdsim"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

//go:embed testdata/crds.yaml
var crdsYAML []byte

type env struct {
	c   *kubetest.Cluster
	cs  kubernetes.Interface
	dyn dynamic.Interface
	d   *Driver
}

func startEnv(t *testing.T) *env {
	t.Helper()
	c := kubetest.Start(t)
	ctx := context.Background()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, crdsYAML, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mcdsim.WaitServed(ctx, dyn, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: MCCNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &env{c: c, cs: cs, dyn: dyn, d: &Driver{C: &Cluster{Kube: cs, Dynamic: dyn}}}
}

// fixture is a pool with its nodes on old and the pool's spec on new.
type fixture struct {
	pool     string
	nodes    []string
	old, new string
}

func roleLabel(pool string) string { return mcdsim.RoleLabel(pool) }

func (e *env) pool(t *testing.T, name string, n int) fixture {
	t.Helper()
	f, err := mcdsim.NewPool(context.Background(), e.cs, e.dyn, name, n)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{pool: f.Pool, nodes: f.Nodes, old: f.Old, new: f.New}
}

// daemons starts a stand-in MCD on each node, Normal unless modes says.
func (e *env) daemons(t *testing.T, ctx context.Context, f fixture, modes map[string]mcdsim.Options) map[string]*mcdsim.MCD {
	t.Helper()
	out := map[string]*mcdsim.MCD{}
	for _, n := range f.nodes {
		m, err := mcdsim.Start(ctx, e.cs, n, modes[n])
		if err != nil {
			t.Fatal(err)
		}
		out[n] = m
	}
	t.Cleanup(func() {
		for n, m := range out {
			if errs := m.Errors(); len(errs) > 0 {
				t.Errorf("stand-in MCD on %s met errors: %v", n, errs)
			}
		}
	})
	return out
}

func (e *env) options(f fixture) Options {
	o := DefaultOptions()
	o.Pool = f.pool
	o.Poll = 50 * time.Millisecond
	o.Drain.Retry = 100 * time.Millisecond
	o.Timeouts = Timeouts{MCD: 60 * time.Second, Drain: 60 * time.Second}
	return o
}

// recorder keeps, per node, the sequence of protocol changes seen on a
// watch: the four annotations of the MCD's protocol, the cordon and Ready.
type recorder struct {
	mu   sync.Mutex
	seq  map[string][]string
	all  []string // node + " " + change, in the order seen
	last map[string]map[string]string
}

func tracked(n *corev1.Node) map[string]string {
	v := ViewOf(n)
	return map[string]string{
		"desiredConfig": v.Desired, "desiredDrain": v.DesiredDrain, "unschedulable": fmt.Sprint(v.Unschedulable),
		"lastAppliedDrain": v.LastAppliedDrain, "Ready": map[bool]string{true: "True", false: "False"}[v.Ready],
		"currentConfig": v.Current,
	}
}

var trackedOrder = []string{"desiredConfig", "desiredDrain", "unschedulable", "lastAppliedDrain", "Ready", "currentConfig"}

func (e *env) record(t *testing.T, ctx context.Context, f fixture) *recorder {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: roleLabel(f.pool)}
	l, err := e.cs.CoreV1().Nodes().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{seq: map[string][]string{}, last: map[string]map[string]string{}}
	for i := range l.Items {
		r.last[l.Items[i].Name] = tracked(&l.Items[i])
	}
	sel.ResourceVersion = l.ResourceVersion
	w, err := e.cs.CoreV1().Nodes().Watch(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			now := tracked(n)
			r.mu.Lock()
			before := r.last[n.Name]
			for _, k := range trackedOrder {
				if before[k] != now[k] {
					c := k + "=" + now[k]
					r.seq[n.Name] = append(r.seq[n.Name], c)
					r.all = append(r.all, n.Name+" "+c)
				}
			}
			r.last[n.Name] = now
			r.mu.Unlock()
		}
	}()
	return r
}

// wait returns node's sequence once it ends with end (or after 10 s).
func (r *recorder) wait(node, end string) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		s := slices.Clone(r.seq[node])
		r.mu.Unlock()
		if (len(s) > 0 && s[len(s)-1] == end) || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *recorder) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// seeds001 is the per-node sequence of the field report in
// docs/machineconfig.md, with the cordon, the
// reboot and the uncordon where they happen.
func seeds001(cfg string) []string {
	return []string{
		"desiredConfig=" + cfg,
		"desiredDrain=" + DrainRequest(cfg),
		"unschedulable=true",
		"lastAppliedDrain=" + DrainRequest(cfg),
		"Ready=False",
		"Ready=True",
		"desiredDrain=" + UncordonRequest(cfg),
		"unschedulable=false",
		"lastAppliedDrain=" + UncordonRequest(cfg),
		"currentConfig=" + cfg,
	}
}

func (e *env) journal(t *testing.T, pool string) *Record {
	t.Helper()
	j := &journal{c: e.d.C, namespace: MCCNamespace, name: JournalName(pool)}
	r, err := j.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) annotations(t *testing.T, f fixture) string {
	t.Helper()
	var b strings.Builder
	for _, n := range f.nodes {
		node, err := e.cs.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %v unschedulable=%t\n", n, tracked(node), node.Spec.Unschedulable)
	}
	return b.String()
}

func (e *env) noJournal(t *testing.T, pool string) {
	t.Helper()
	_, err := e.cs.CoreV1().ConfigMaps(MCCNamespace).Get(context.Background(), JournalName(pool), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("journal of pool %s: want none, got err=%v", pool, err)
	}
}

// drainGuard watches a pool's nodes and records every drain answer
// (lastAppliedDrain = drain-<config>) written while the node was not
// cordoned or still had a pod a drain must evict: the guarantee that the
// MCD reboots only a drained node.
type drainGuard struct {
	mu         sync.Mutex
	answers    int
	violations []string
}

func (e *env) guardDrains(t *testing.T, ctx context.Context, f fixture) *drainGuard {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: roleLabel(f.pool)}
	l, err := e.cs.CoreV1().Nodes().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	sel.ResourceVersion = l.ResourceVersion
	w, err := e.cs.CoreV1().Nodes().Watch(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	g := &drainGuard{}
	last := map[string]string{}
	for _, n := range l.Items {
		last[n.Name] = n.Annotations[AnnoLastAppliedDrain]
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			la := n.Annotations[AnnoLastAppliedDrain]
			if la == last[n.Name] || la != DrainRequest(f.new) {
				last[n.Name] = la
				continue
			}
			last[n.Name] = la
			pods, err := e.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
			g.mu.Lock()
			g.answers++
			switch {
			case err != nil:
				if ctx.Err() == nil {
					g.violations = append(g.violations, fmt.Sprintf("%s: list pods: %v", n.Name, err))
				}
			case !n.Spec.Unschedulable:
				g.violations = append(g.violations, n.Name+": drain answered while the node was not cordoned")
			default:
				// Terminating pods are gone as far as the drain goes.
				var left []string
				evict, _ := evictable(pods.Items, true)
				for _, p := range evict {
					if p.DeletionTimestamp == nil {
						left = append(left, p.Namespace+"/"+p.Name)
					}
				}
				if len(left) > 0 {
					g.violations = append(g.violations, fmt.Sprintf("%s: drain answered with pods left: %v", n.Name, left))
				}
			}
			g.mu.Unlock()
		}
	}()
	return g
}

// check fails t on a violation, and when no answer was seen at all.
func (g *drainGuard) err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.violations) > 0 {
		return fmt.Errorf("drain guarantee violated: %s", strings.Join(g.violations, "; "))
	}
	if g.answers == 0 {
		return fmt.Errorf("no drain answer was seen")
	}
	return nil
}

func (e *env) annotate(ctx context.Context, node string, kv map[string]string) error {
	return e.d.C.annotateAll(ctx, node, kv)
}
