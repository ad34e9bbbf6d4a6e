// Package openshift is the coordinator side of the openshift-sdn profile:
// hooks (coordinator.Hook) that keep openshift-sdn from fighting a cutover,
// and the SDN's source of truth, the ClusterNetwork object.
//
// openshift-sdn reads the VXLAN port from ClusterNetwork "default"
// (vxlanPort) at start only; a health check every 30 s exits the SDN when
// vxlan0's dst_port differs from it, and at start an SDN that finds OVS on
// another port deletes and rebuilds br0 (every pod re-attached). Two
// strategies keep that from happening:
//
//   - StrategySourceOfTruthFirst: recreate the ClusterNetwork with the new
//     port just before commit, then restart the SDN pods one at a time after
//     confirm, so each starts, finds OVS already on the new port, and does
//     not rebuild;
//   - StrategyFieldReport (the field report, docs/design.md): roll the SDN DaemonSet to a
//     user-supplied image without the health check before commit, then
//     after confirm change the ClusterNetwork and roll the saved image and
//     its image.openshift.io/triggers annotation back.
//
// It owns only Kubernetes API objects (the ClusterNetwork, the SDN
// DaemonSet's image and annotation, its Pods, and one ConfigMap holding the
// saved DaemonSet fields). It never touches a node's dataplane: that is the
// agents' openshift-sdn profile.
package openshift

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// ClusterNetworkGVR is network.openshift.io/v1 ClusterNetwork.
var ClusterNetworkGVR = schema.GroupVersionResource{Group: "network.openshift.io", Version: "v1", Resource: "clusternetworks"}

// DefaultVXLANPort is openshift-sdn's port when vxlanPort is unset.
const DefaultVXLANPort = 4789

// ClusterNetwork is openshift-sdn's source of truth. Its vxlanPort cannot
// be updated (OpenShift refuses it), so a change deletes the object and
// creates it again with every other field kept.
type ClusterNetwork struct {
	Client dynamic.Interface
	Name   string // "default"
}

var _ kube.SourceOfTruth = (*ClusterNetwork)(nil)

func (c *ClusterNetwork) name() string {
	if c.Name == "" {
		return "default"
	}
	return c.Name
}

func (c *ClusterNetwork) where() string { return "ClusterNetwork " + c.name() }

func (c *ClusterNetwork) get(ctx context.Context) (*unstructured.Unstructured, error) {
	u, err := c.Client.Resource(ClusterNetworkGVR).Get(ctx, c.name(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.where(), err)
	}
	return u, nil
}

// portOf is vxlanPort, or the default when unset.
func portOf(u *unstructured.Unstructured) (port tunnelport.Port, set bool, err error) {
	v, found, err := unstructured.NestedFieldNoCopy(u.Object, "vxlanPort")
	if err != nil {
		return 0, false, err
	}
	if !found || v == nil {
		return DefaultVXLANPort, false, nil
	}
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case float64:
		n = int64(x)
	default:
		return 0, false, fmt.Errorf("vxlanPort %v (%T): not a number", v, v)
	}
	p, err := tunnelport.From("vxlanPort", n)
	return p, err == nil, err
}

// Describe implements kube.SourceOfTruth.
func (c *ClusterNetwork) Describe(ctx context.Context) (string, error) {
	u, err := c.get(ctx)
	if err != nil {
		return "", err
	}
	p, set, err := portOf(u)
	if err != nil {
		return "", fmt.Errorf("%s: %w", c.where(), err)
	}
	if !set {
		return fmt.Sprintf("%s has no vxlanPort (openshift-sdn's default %d)", c.where(), p), nil
	}
	return fmt.Sprintf("%s has vxlanPort %d", c.where(), p), nil
}

// Port implements kube.SourceOfTruth.
func (c *ClusterNetwork) Port(ctx context.Context) (tunnelport.Port, error) {
	u, err := c.get(ctx)
	if err != nil {
		return 0, err
	}
	p, _, err := portOf(u)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.where(), err)
	}
	return p, nil
}

// Update implements kube.SourceOfTruth: recreate with port.
func (c *ClusterNetwork) Update(ctx context.Context, port tunnelport.Port) error {
	return c.Recreate(ctx, port)
}

// Restore implements kube.SourceOfTruth: recreate with the old port.
func (c *ClusterNetwork) Restore(ctx context.Context, port tunnelport.Port) error {
	return c.Recreate(ctx, port)
}

// Recreate deletes the ClusterNetwork and creates it again with vxlanPort
// port and every other field as it was. When it already says port it does
// nothing (a replay). If the create fails, the old object is created again
// so the cluster is never left without one.
func (c *ClusterNetwork) Recreate(ctx context.Context, port tunnelport.Port) error {
	if _, err := tunnelport.From("vxlanPort", int64(port)); err != nil {
		return fmt.Errorf("%s: %w", c.where(), err)
	}
	res := c.Client.Resource(ClusterNetworkGVR)
	old, err := c.get(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			// A delete whose create failed in an earlier run: nothing to
			// keep fields from; refuse rather than invent a network.
			return fmt.Errorf("%w: create it again from master-config (networkConfig) before retrying", err)
		}
		return err
	}
	if p, set, err := portOf(old); err == nil && set && p == port {
		return nil
	}
	backup := old.DeepCopy()
	for _, f := range []string{"resourceVersion", "uid", "creationTimestamp", "managedFields", "generation", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"} {
		unstructured.RemoveNestedField(backup.Object, "metadata", f)
	}
	fresh := backup.DeepCopy()
	if err := unstructured.SetNestedField(fresh.Object, int64(port), "vxlanPort"); err != nil {
		return err
	}
	uid := old.GetUID()
	if err := res.Delete(ctx, c.name(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: delete (to recreate with vxlanPort %d): %w", c.where(), port, err)
	}
	// A finalizer could keep the object a moment: create until it is gone.
	var cerr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, cerr = res.Create(ctx, fresh, metav1.CreateOptions{}); cerr == nil || !apierrors.IsAlreadyExists(cerr) {
			break
		}
	}
	if cerr != nil {
		if _, berr := res.Create(context.WithoutCancel(ctx), backup, metav1.CreateOptions{}); berr != nil {
			return fmt.Errorf("%s: create with vxlanPort %d: %w; and putting the old one back failed too: %w — the cluster has NO ClusterNetwork now, create it from master-config", c.where(), port, cerr, berr)
		}
		return fmt.Errorf("%s: create with vxlanPort %d: %w (the old object was put back)", c.where(), port, cerr)
	}
	return nil
}
