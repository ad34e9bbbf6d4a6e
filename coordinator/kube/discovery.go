package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/cutover-dev/cutover/coordinator"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// DiscoveryConfig says where the agents are.
type DiscoveryConfig struct {
	Namespace    string // of the agent DaemonSet's pods
	PodSelector  string // label selector of the agent pods
	NodeSelector string // label selector of the nodes the cutover targets; empty: every node
	AgentPort    int    // the agents' gRPC port on the host network
}

// DefaultDiscovery matches deploy/base.
func DefaultDiscovery() DiscoveryConfig {
	return DiscoveryConfig{Namespace: "cutover", PodSelector: "app.kubernetes.io/name=cutover-agent", AgentPort: 9443}
}

// Validate checks c; errors name the field, the value and the reason.
func (c DiscoveryConfig) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("agent namespace: empty: name the namespace of the agent DaemonSet"))
	}
	if strings.TrimSpace(c.PodSelector) == "" {
		errs = append(errs, fmt.Errorf("agent pod selector %q: empty: want a label selector such as app.kubernetes.io/name=cutover-agent", c.PodSelector))
	} else if _, err := labels.Parse(c.PodSelector); err != nil {
		errs = append(errs, fmt.Errorf("agent pod selector %q: not a label selector: %w", c.PodSelector, err))
	}
	if _, err := labels.Parse(c.NodeSelector); err != nil {
		errs = append(errs, fmt.Errorf("node selector %q: not a label selector: %w", c.NodeSelector, err))
	}
	if c.AgentPort < 1 || c.AgentPort > 65535 {
		errs = append(errs, fmt.Errorf("agent port %d: want 1–65535", c.AgentPort))
	}
	return errors.Join(errs...)
}

// Discovery lists agents and Nodes from the API on demand: an operation
// starts rarely, and a fresh list is what preflight must judge, so a
// watch cache would buy nothing but staleness.
type Discovery struct {
	client kubernetes.Interface
	cfg    DiscoveryConfig
	pods   labels.Selector
	nodes  labels.Selector
}

// NewDiscovery validates cfg.
func NewDiscovery(client kubernetes.Interface, cfg DiscoveryConfig) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ps, _ := labels.Parse(cfg.PodSelector)
	ns, _ := labels.Parse(cfg.NodeSelector)
	return &Discovery{client: client, cfg: cfg, pods: ps, nodes: ns}, nil
}

// NodeState is one Node as discovery judged it.
type NodeState struct {
	Name        string
	Ready       bool
	Schedulable bool
	Agent       string // "host:port" of its ready agent; empty when none
	Pod         string // the agent pod (ready or not) found on it, if any
	Why         string // why it has no ready agent
	Overlay     string // its coordinator.OverlayLabel; empty: the default overlay
}

// Result is one discovery: the agents found and the problems that must
// fail preflight.
type Result struct {
	Agents   []coordinator.AgentSpec // ready agents on targeted nodes, sorted by node
	Nodes    []NodeState             // targeted nodes, sorted by name
	Problems []string                // one sentence per problem, sorted
}

// Discover lists the targeted Nodes and the agent pods once and pairs
// them. A Ready, schedulable targeted node without a ready agent is a
// problem, by name; an unready or cordoned node without one is not (it is
// reported in Nodes), but a ready agent on it is still used, because a
// cordoned node keeps its pods and their overlay traffic.
func (d *Discovery) Discover(ctx context.Context) (Result, error) {
	nodes, err := d.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: d.nodes.String()})
	if err != nil {
		return Result{}, fmt.Errorf("discovery: list nodes (selector %q): %w", d.cfg.NodeSelector, err)
	}
	pods, err := d.client.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: d.pods.String()})
	if err != nil {
		return Result{}, fmt.Errorf("discovery: list agent pods in namespace %s (selector %q): %w", d.cfg.Namespace, d.cfg.PodSelector, err)
	}
	return pair(nodes.Items, pods.Items, d.cfg), nil
}

// pair is Discover's logic without I/O.
func pair(nodes []corev1.Node, pods []corev1.Pod, cfg DiscoveryConfig) Result {
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	var r Result
	for _, n := range nodes {
		st := NodeState{Name: n.Name, Ready: nodeReady(&n), Schedulable: !n.Spec.Unschedulable, Overlay: n.Labels[coordinator.OverlayLabel]}
		cands := byNode[n.Name]
		// A rolling update can leave two agent pods on a node for a while;
		// the ready, newest one is the agent.
		slices.SortFunc(cands, func(a, b corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
		var reasons []string
		for _, p := range cands {
			st.Pod = p.Name
			why := podUnready(&p)
			if why == "" {
				st.Agent = net.JoinHostPort(p.Status.HostIP, strconv.Itoa(cfg.AgentPort))
				break
			}
			reasons = append(reasons, fmt.Sprintf("pod %s/%s %s", p.Namespace, p.Name, why))
		}
		if st.Agent == "" && len(cands) > 0 {
			st.Pod = cands[0].Name
		}
		switch {
		case st.Agent != "":
			lbl := map[string]string{}
			for k, v := range n.Labels {
				lbl[k] = v
			}
			r.Agents = append(r.Agents, coordinator.AgentSpec{Node: n.Name, Address: st.Agent, Labels: lbl, Overlay: st.Overlay})
		case len(reasons) > 0:
			st.Why = strings.Join(reasons, "; ")
		default:
			st.Why = fmt.Sprintf("no pod matching %q in namespace %s is scheduled on it", cfg.PodSelector, cfg.Namespace)
		}
		if st.Agent == "" && st.Ready && st.Schedulable {
			r.Problems = append(r.Problems, fmt.Sprintf("node %s is Ready but has no ready cutover agent: %s", n.Name, st.Why))
		}
		r.Nodes = append(r.Nodes, st)
	}
	slices.SortFunc(r.Agents, func(a, b coordinator.AgentSpec) int { return strings.Compare(a.Node, b.Node) })
	slices.SortFunc(r.Nodes, func(a, b NodeState) int { return strings.Compare(a.Name, b.Name) })
	if len(nodes) == 0 {
		sel := cfg.NodeSelector
		if sel == "" {
			sel = "(every node)"
		}
		r.Problems = append(r.Problems, fmt.Sprintf("node selector %s matches no node", sel))
	}
	slices.Sort(r.Problems)
	return r
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podUnready says why p is not a usable agent; empty when it is.
func podUnready(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "is terminating"
	}
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Sprintf("is %s, not Running", orUnknown(string(p.Status.Phase)))
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
			if !ready {
				msg := c.Reason
				if c.Message != "" {
					msg += ": " + c.Message
				}
				return "is not Ready (" + orUnknown(msg) + ")"
			}
		}
	}
	if !ready {
		return "has no Ready condition yet"
	}
	if net.ParseIP(p.Status.HostIP) == nil {
		return fmt.Sprintf("has no host IP in its status (%q)", p.Status.HostIP)
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Inventory discovers and returns the agents as the coordinator's
// inventory. It does not fail on Problems (a NotReady node is not the
// inventory's business); Preflight does.
func (d *Discovery) Inventory(ctx context.Context) (coordinator.Inventory, error) {
	r, err := d.Discover(ctx)
	if err != nil {
		return coordinator.Inventory{}, err
	}
	return coordinator.NewInventory(fmt.Sprintf("kubernetes pods %s/%s", d.cfg.Namespace, d.cfg.PodSelector), r.Agents)
}

// Preflight discovers again and returns one problem per node of the
// overlays nodes belong to that must have an agent and has none, plus one
// per node of those overlays whose agent appeared, went or moved since
// inv (the coordinator's inventory, read just before: the operation's
// nodes come from it) was read. Nodes of other overlays are not this
// operation's business: it neither moves nor cuts them off. Empty means
// discovery has no objection.
func (d *Discovery) Preflight(ctx context.Context, inv coordinator.Inventory, nodes []string) ([]string, error) {
	r, err := d.Discover(ctx)
	if err != nil {
		return nil, err
	}
	overlayOf := map[string]string{}
	for _, st := range r.Nodes {
		overlayOf[st.Name] = cmp.Or(st.Overlay, coordinator.DefaultOverlay)
	}
	known := map[string]string{}
	for _, a := range inv.Agents {
		known[a.Node] = a.Address
		if _, ok := overlayOf[a.Node]; !ok {
			overlayOf[a.Node] = a.OverlayName()
		}
	}
	touched := map[string]bool{}
	for _, n := range nodes {
		touched[overlayOf[n]] = true
	}
	var probs []string
	for _, st := range r.Nodes {
		if st.Agent == "" && st.Ready && st.Schedulable && touched[overlayOf[st.Name]] {
			probs = append(probs, fmt.Sprintf("node %s is Ready but has no ready cutover agent: %s", st.Name, st.Why))
		}
	}
	if len(r.Nodes) == 0 {
		probs = append(probs, r.Problems...) // the selector matches no node
	}
	found := map[string]string{}
	for _, a := range r.Agents {
		found[a.Node] = a.Address
		if _, ok := known[a.Node]; !ok && touched[overlayOf[a.Node]] {
			probs = append(probs, fmt.Sprintf("node %s has a ready cutover agent at %s that appeared while this plan ran: plan again, so that it is included", a.Node, a.Address))
		}
	}
	for _, n := range nodes {
		addr, ok := found[n]
		switch {
		case !ok:
			st, ok := slices.BinarySearchFunc(r.Nodes, n, func(s NodeState, n string) int { return strings.Compare(s.Name, n) })
			why := "the node is gone or no longer matches the node selector"
			if ok {
				why = r.Nodes[st].Why
			}
			p := fmt.Sprintf("node %s is targeted but has no ready cutover agent: %s", n, why)
			if !slices.ContainsFunc(probs, func(s string) bool { return strings.HasPrefix(s, "node "+n+" is Ready") }) {
				probs = append(probs, p)
			}
		case addr != known[n]:
			probs = append(probs, fmt.Sprintf("node %s: its agent moved from %s to %s while this plan ran: plan again", n, known[n], addr))
		}
	}
	slices.Sort(probs)
	return slices.Compact(probs), nil
}

// String dumps r as canonical text, one line per node, then the problems.
func (r Result) String() string {
	var b strings.Builder
	for _, n := range r.Nodes {
		fmt.Fprintf(&b, "node %s ready=%t schedulable=%t", n.Name, n.Ready, n.Schedulable)
		if n.Agent != "" {
			fmt.Fprintf(&b, " agent=%s pod=%s", n.Agent, n.Pod)
		} else {
			fmt.Fprintf(&b, " no-agent: %s", n.Why)
		}
		b.WriteByte('\n')
	}
	for _, a := range r.Agents {
		keys := make([]string, 0, len(a.Labels))
		for k, v := range a.Labels {
			keys = append(keys, k+"="+v)
		}
		slices.Sort(keys)
		fmt.Fprintf(&b, "agent %s %s %s\n", a.Node, a.Address, strings.Join(keys, ","))
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	return b.String()
}
