package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// node builds a Node; ready and unschedulable as given.
func node(name string, ready, unschedulable bool, labels map[string]string) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}},
	}
}

// agentPod builds an agent pod on nodeName; ready as given; age orders
// pods on one node (larger is newer).
func agentPod(name, nodeName, hostIP string, ready bool, age int) *corev1.Pod {
	st := corev1.ConditionFalse
	reason := "ContainersNotReady"
	if ready {
		st, reason = corev1.ConditionTrue, ""
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "cutover",
			Labels:            map[string]string{"app.kubernetes.io/name": "cutover-agent"},
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000+int64(age), 0))},
		Spec: corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: hostIP,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, Reason: reason}}},
	}
}

func TestDiscover(t *testing.T) {
	other := agentPod("other-x", "worker-1", "198.18.0.99", true, 0)
	other.Labels = map[string]string{"app": "something-else"}
	pending := agentPod("agent-p", "worker-5", "", false, 0)
	pending.Status.Phase = corev1.PodPending
	objs := []runtime.Object{
		node("worker-1", true, false, map[string]string{"zone": "a", "role": "worker"}),
		node("worker-2", true, false, map[string]string{"zone": "b"}),
		node("worker-3", true, false, nil),                        // no agent at all → problem
		node("worker-4", true, true, nil),                         // cordoned, no agent → fine
		node("worker-5", false, false, nil),                       // NotReady, pending agent → fine
		node("worker-6", true, false, nil),                        // unready agent → problem with reason
		node("worker-7", true, true, map[string]string{"z": "c"}), // cordoned with agent → used
		agentPod("agent-1", "worker-1", "198.18.0.1", true, 0),
		agentPod("agent-2-old", "worker-2", "198.18.0.2", false, 0),
		agentPod("agent-2-new", "worker-2", "198.18.0.2", true, 5),
		pending,
		agentPod("agent-6", "worker-6", "198.18.0.6", false, 0),
		agentPod("agent-7", "worker-7", "198.18.0.7", true, 0),
		other,
	}
	d, err := NewDiscovery(fake.NewClientset(objs...), DefaultDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := `node worker-1 ready=true schedulable=true agent=198.18.0.1:9443 pod=agent-1
node worker-2 ready=true schedulable=true agent=198.18.0.2:9443 pod=agent-2-new
node worker-3 ready=true schedulable=true no-agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
node worker-4 ready=true schedulable=false no-agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
node worker-5 ready=false schedulable=true no-agent: pod cutover/agent-p is Pending, not Running
node worker-6 ready=true schedulable=true no-agent: pod cutover/agent-6 is not Ready (ContainersNotReady)
node worker-7 ready=true schedulable=false agent=198.18.0.7:9443 pod=agent-7
agent worker-1 198.18.0.1:9443 role=worker,zone=a
agent worker-2 198.18.0.2:9443 zone=b
agent worker-7 198.18.0.7:9443 z=c
problem: node worker-3 is Ready but has no ready cutover agent: no pod matching "app.kubernetes.io/name=cutover-agent" in namespace cutover is scheduled on it
problem: node worker-6 is Ready but has no ready cutover agent: pod cutover/agent-6 is not Ready (ContainersNotReady)
`
	if got := r.String(); got != want {
		t.Errorf("discovery:\n%s\nwant:\n%s", got, want)
	}
}

func TestDiscoverNodeSelector(t *testing.T) {
	objs := []runtime.Object{
		node("a", true, false, map[string]string{"pool": "blue"}),
		node("b", true, false, map[string]string{"pool": "green"}), // no agent, but not targeted
		agentPod("agent-a", "a", "198.18.0.1", true, 0),
	}
	cfg := DefaultDiscovery()
	cfg.NodeSelector = "pool=blue"
	cfg.AgentPort = 7000
	d, err := NewDiscovery(fake.NewClientset(objs...), cfg)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := d.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Agents) != 1 || inv.Agents[0].Address != "198.18.0.1:7000" || inv.Agents[0].Labels["pool"] != "blue" {
		t.Errorf("inventory %+v", inv)
	}
	probs, err := d.Preflight(context.Background(), inv, []string{"a"})
	if err != nil || len(probs) != 0 {
		t.Errorf("preflight: %v %q", err, probs)
	}

	cfg.NodeSelector = "pool=red"
	d, _ = NewDiscovery(fake.NewClientset(objs...), cfg)
	r, _ := d.Discover(context.Background())
	if len(r.Problems) != 1 || r.Problems[0] != "node selector pool=red matches no node" {
		t.Errorf("problems %q", r.Problems)
	}
}

func TestPreflightAfterChanges(t *testing.T) {
	cs := fake.NewClientset(
		node("a", true, false, nil), node("b", true, false, nil),
		agentPod("agent-a", "a", "198.18.0.1", true, 0), agentPod("agent-b", "b", "198.18.0.2", true, 0))
	d, _ := NewDiscovery(cs, DefaultDiscovery())
	ctx := context.Background()
	inv, err := d.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b's agent becomes unready, a new node c joins with an agent, a's
	// agent is replaced on another address.
	pb := agentPod("agent-b", "b", "198.18.0.2", false, 0)
	if _, err := cs.CoreV1().Pods("cutover").Update(ctx, pb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = cs.CoreV1().Pods("cutover").Delete(ctx, "agent-a", metav1.DeleteOptions{})
	_, _ = cs.CoreV1().Pods("cutover").Create(ctx, agentPod("agent-a2", "a", "198.18.0.11", true, 9), metav1.CreateOptions{})
	_, _ = cs.CoreV1().Nodes().Create(ctx, node("c", true, false, nil), metav1.CreateOptions{})
	_, _ = cs.CoreV1().Pods("cutover").Create(ctx, agentPod("agent-c", "c", "198.18.0.3", true, 0), metav1.CreateOptions{})
	probs, err := d.Preflight(ctx, inv, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"node a: its agent moved from 198.18.0.1:9443 to 198.18.0.11:9443 while this plan ran: plan again",
		"node b is Ready but has no ready cutover agent: pod cutover/agent-b is not Ready (ContainersNotReady)",
		"node c has a ready cutover agent at 198.18.0.3:9443 that appeared while this plan ran: plan again, so that it is included",
	}
	if strings.Join(probs, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(probs, "\n"), strings.Join(want, "\n"))
	}
}

// TestPreflightOverlays: nodes of an overlay the operation does not touch
// are not its business; those of its own overlay are, targeted
// or not.
func TestPreflightOverlays(t *testing.T) {
	blue := map[string]string{coordinator.OverlayLabel: "blue"}
	cs := fake.NewClientset(
		node("a", true, false, nil), node("b", true, false, nil), node("c", true, false, blue), node("d", true, false, blue),
		agentPod("agent-a", "a", "198.18.0.1", true, 0), agentPod("agent-b", "b", "198.18.0.2", true, 0),
		agentPod("agent-c", "c", "198.18.0.3", true, 0))
	d, _ := NewDiscovery(cs, DefaultDiscovery())
	ctx := context.Background()
	inv, err := d.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Agents[2]; got.Node != "c" || got.Overlay != "blue" {
		t.Fatalf("agent c: %+v", got)
	}
	probs, err := d.Preflight(ctx, inv, []string{"a", "b"})
	if err != nil || len(probs) != 0 {
		t.Errorf("default overlay: %q %v", probs, err)
	}
	probs, err = d.Preflight(ctx, inv, []string{"c"})
	want := "node d is Ready but has no ready cutover agent: no pod matching \"app.kubernetes.io/name=cutover-agent\" in namespace cutover is scheduled on it"
	if err != nil || len(probs) != 1 || probs[0] != want {
		t.Errorf("overlay blue: %q %v", probs, err)
	}
}

func TestDiscoveryConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*DiscoveryConfig)
		want string
	}{
		{func(c *DiscoveryConfig) { c.Namespace = "" }, "agent namespace: empty"},
		{func(c *DiscoveryConfig) { c.PodSelector = "" }, `agent pod selector ""`},
		{func(c *DiscoveryConfig) { c.PodSelector = "a b" }, `agent pod selector "a b"`},
		{func(c *DiscoveryConfig) { c.NodeSelector = "x=(" }, `node selector "x=("`},
		{func(c *DiscoveryConfig) { c.AgentPort = 70000 }, "agent port 70000: want 1–65535"},
	} {
		c := DefaultDiscovery()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
	if err := DefaultDiscovery().Validate(); err != nil {
		t.Error(err)
	}
}
