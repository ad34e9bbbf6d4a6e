package sdnsim

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ClusterNetworkGVR is OpenShift's ClusterNetwork resource (cluster-scoped;
// the SDN reads the object named "default").
var ClusterNetworkGVR = schema.GroupVersionResource{Group: "network.openshift.io", Version: "v1", Resource: "clusternetworks"}

// DefaultVXLANPort is openshift-sdn's port when vxlanPort is unset.
const DefaultVXLANPort = 4789

// ClusterNetworkCRD stands in for OpenShift's API: the ClusterNetwork kind
// with vxlanPort typed and, like OpenShift's validation, a vxlanPort that
// cannot be changed by an update (the object must be deleted and created
// again). The other fields are kept as they come.
const ClusterNetworkCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusternetworks.network.openshift.io
spec:
  group: network.openshift.io
  scope: Cluster
  names:
    plural: clusternetworks
    singular: clusternetwork
    kind: ClusterNetwork
    listKind: ClusterNetworkList
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
        x-kubernetes-validations:
        - rule: "has(self.vxlanPort) == has(oldSelf.vxlanPort) && (!has(self.vxlanPort) || self.vxlanPort == oldSelf.vxlanPort)"
          message: "cannot change the VXLAN port of the ClusterNetwork: delete it and create it again (master-config networkConfig.vxlanPort)"
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          vxlanPort:
            type: integer
            minimum: 1
            maximum: 65535
`

// ClusterNetwork reads the port from the ClusterNetwork object, as
// openshift-sdn does at start.
type ClusterNetwork struct {
	Client dynamic.Interface
	Name   string // "default"
}

// VXLANPort implements PortSource.
func (c ClusterNetwork) VXLANPort(ctx context.Context) (uint16, error) {
	name := c.Name
	if name == "" {
		name = "default"
	}
	u, err := c.Client.Resource(ClusterNetworkGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("clusternetwork %s: not found (the SDN cannot start without it): %w", name, err)
		}
		return 0, fmt.Errorf("clusternetwork %s: %w", name, err)
	}
	return PortOf(u)
}

// PortOf is vxlanPort of a ClusterNetwork object (the default when unset).
func PortOf(u *unstructured.Unstructured) (uint16, error) {
	v, found, err := unstructured.NestedFieldNoCopy(u.Object, "vxlanPort")
	if err != nil {
		return 0, fmt.Errorf("clusternetwork %s: vxlanPort: %w", u.GetName(), err)
	}
	if !found || v == nil {
		return DefaultVXLANPort, nil
	}
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case float64:
		n = int64(x)
	default:
		return 0, fmt.Errorf("clusternetwork %s: vxlanPort %v (%T): not a number", u.GetName(), v, v)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("clusternetwork %s: vxlanPort %d: want 1-65535", u.GetName(), n)
	}
	return uint16(n), nil
}

// NewClusterNetwork is a ClusterNetwork object shaped like a 3.11 one.
func NewClusterNetwork(port uint16, cidr string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "network.openshift.io/v1",
		"kind":       "ClusterNetwork",
		"metadata":   map[string]any{"name": "default"},
		"network":    cidr,
		"clusterNetworks": []any{
			map[string]any{"CIDR": cidr, "hostSubnetLength": int64(8)},
		},
		"hostsubnetlength": int64(8),
		"serviceNetwork":   "198.18.240.0/24",
		"pluginName":       "redhat/openshift-ovs-subnet",
		"vxlanPort":        int64(port),
	}}
}
