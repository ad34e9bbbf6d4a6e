package machineconfig

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Cluster is the API the rollout reads and writes: client-go for Nodes,
// Pods, evictions, Leases and the journal; the dynamic client for the MCO's
// types, so no OpenShift client library is needed.
type Cluster struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// InputError is bad input: it names the field, the value and the reason.
// Nothing has been changed when it is returned.
type InputError struct {
	Field, Value, Reason string
}

func (e *InputError) Error() string { return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason) }

// IsInput reports whether err is bad input.
func IsInput(err error) bool {
	var ie *InputError
	return errors.As(err, &ie)
}

// Pool is what the rollout needs of a MachineConfigPool.
type Pool struct {
	Name         string
	SpecConfig   string // spec.configuration.name: the rendered config the MCC wants
	StatusConfig string // status.configuration.name: the one the pool is on
	Paused       bool
	Selector     labels.Selector // nil: the pool has no spec.nodeSelector and selects no node
}

// Pool reads a MachineConfigPool; an unknown pool is an *InputError.
func (c *Cluster) Pool(ctx context.Context, name string) (*Pool, error) {
	u, err := c.Dynamic.Resource(MachineConfigPoolGVR).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &InputError{Field: "--pool", Value: name, Reason: "no such MachineConfigPool"}
	}
	if err != nil {
		return nil, fmt.Errorf("get MachineConfigPool %s: %w", name, err)
	}
	p := &Pool{Name: name}
	p.SpecConfig, _, _ = unstructured.NestedString(u.Object, "spec", "configuration", "name")
	p.StatusConfig, _, _ = unstructured.NestedString(u.Object, "status", "configuration", "name")
	p.Paused, _, _ = unstructured.NestedBool(u.Object, "spec", "paused")
	raw, found, _ := unstructured.NestedMap(u.Object, "spec", "nodeSelector")
	if !found {
		// The MCC selects no node for a pool without a nodeSelector.
		return p, nil
	}
	var ls metav1.LabelSelector
	if err := runtimeConvert(raw, &ls); err != nil {
		return nil, fmt.Errorf("MachineConfigPool %s: spec.nodeSelector: %w", name, err)
	}
	p.Selector, err = metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return nil, fmt.Errorf("MachineConfigPool %s: spec.nodeSelector: %w", name, err)
	}
	return p, nil
}

// Rendered is a rendered MachineConfig of a pool.
type Rendered struct {
	Name    string
	Created time.Time
}

// RenderedConfigs lists the MachineConfigs the MCC rendered for pool (a
// controller ownerReference to the MachineConfigPool, as the render
// controller sets it), newest first.
func (c *Cluster) RenderedConfigs(ctx context.Context, pool string) ([]Rendered, error) {
	l, err := c.Dynamic.Resource(MachineConfigGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list MachineConfigs: %w", err)
	}
	var out []Rendered
	for _, u := range l.Items {
		if ownedByPool(&u, pool) {
			out = append(out, Rendered{Name: u.GetName(), Created: u.GetCreationTimestamp().Time})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].Name > out[j].Name
	})
	return out, nil
}

func ownedByPool(u *unstructured.Unstructured, pool string) bool {
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "MachineConfigPool" && o.Name == pool && strings.HasPrefix(o.APIVersion, MachineConfigPoolGVR.Group+"/") {
			return true
		}
	}
	return false
}

// PoolNodes returns the pool's nodes sorted by name.
func (c *Cluster) PoolNodes(ctx context.Context, p *Pool) ([]corev1.Node, error) {
	if p.Selector == nil {
		return nil, nil
	}
	l, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: p.Selector.String()})
	if err != nil {
		return nil, fmt.Errorf("list nodes of pool %s: %w", p.Name, err)
	}
	nodes := l.Items
	slices.SortFunc(nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return nodes, nil
}

// MCC is what the rollout knows of the machine-config-controller.
type MCC struct {
	Alive  bool      `json:"alive"`
	Holder string    `json:"holder,omitempty"`
	Renew  time.Time `json:"renewTime,omitzero"`
	Why    string    `json:"why"` // how Alive was judged, for the report
}

// MCCState judges whether the MCC is alive by its leader-election Lease: it
// is alive while the Lease has a holder whose renewTime is less than
// leaseDurationSeconds old. An MCC that cannot reach the API (its
// service address was served by a broken SDN, docs/machineconfig.md) cannot renew, so its
// Lease lapses within a lease duration (137 s by library-go's defaults).
// Pool status is no evidence either way: a healthy MCC with nothing to do
// changes nothing.
func (c *Cluster) MCCState(ctx context.Context, now time.Time) (MCC, error) {
	l, err := c.Kube.CoordinationV1().Leases(MCCNamespace).Get(ctx, MCCLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return MCC{Why: fmt.Sprintf("no Lease %s/%s", MCCNamespace, MCCLease)}, nil
	}
	if err != nil {
		return MCC{}, fmt.Errorf("get the MCC's Lease %s/%s: %w", MCCNamespace, MCCLease, err)
	}
	m := MCC{}
	if l.Spec.HolderIdentity != nil {
		m.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		m.Renew = l.Spec.RenewTime.Time
	}
	dur := 137 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	switch {
	case m.Holder == "":
		m.Why = fmt.Sprintf("Lease %s/%s has no holder", MCCNamespace, MCCLease)
	case m.Renew.IsZero():
		m.Why = fmt.Sprintf("Lease %s/%s was never renewed", MCCNamespace, MCCLease)
	case now.Sub(m.Renew) < dur:
		m.Alive = true
		m.Why = fmt.Sprintf("Lease %s/%s held by %s, renewed %s ago (lease duration %s)", MCCNamespace, MCCLease, m.Holder, now.Sub(m.Renew).Round(time.Second), dur)
	default:
		m.Why = fmt.Sprintf("Lease %s/%s held by %s lapsed: last renewed %s ago (lease duration %s)", MCCNamespace, MCCLease, m.Holder, now.Sub(m.Renew).Round(time.Second), dur)
	}
	return m, nil
}
