package openshift

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Cluster Network Operator's configuration (OpenShift 4.x): the
// cluster-scoped Network `cluster` of operator.openshift.io/v1, whose
// spec.defaultNetwork.openshiftSDNConfig.vxlanPort is openshift-sdn's port
// (openshift/api operator/v1 types_network.go).
var cnoNetworks = schema.GroupVersionResource{Group: "operator.openshift.io", Version: "v1", Resource: "networks"}

// CNOObject is the name of the operator's one Network object.
const CNOObject = "cluster"

// cnoProblem returns why the cutover must not run when the Cluster Network
// Operator is installed, "" when it is not (OpenShift 3.11, or a cluster
// without it). The operator renders openshift-sdn's ClusterNetwork and
// DaemonSet from its own Network object and rejects a change of vxlanPort
// there (cluster-network-operator pkg/network/openshift_sdn.go,
// isOpenShiftSDNChangeSafe: "cannot change openshift-sdn vxlanPort",
// commit 20f9f3f8, the last with openshift-sdn), so neither writing the
// ClusterNetwork nor writing the operator's config keeps a new port: the
// operator puts the old one back. Refusing by name is the only honest
// answer. The check asks API discovery whether networks.operator.openshift.io
// is served, then reads the object for the message.
func (h *Hook) cnoProblem(ctx context.Context) string {
	rl, err := h.cfg.Client.Discovery().ServerResourcesForGroupVersion(cnoNetworks.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return ""
	case err != nil:
		return fmt.Sprintf("cannot tell whether the Cluster Network Operator (OpenShift 4.x) manages the SDN: discovery of %s: %v", cnoNetworks.GroupVersion(), err)
	}
	served := false
	for _, r := range rl.APIResources {
		if r.Name == cnoNetworks.Resource {
			served = true
		}
	}
	if !served {
		return ""
	}
	what := "its Network " + CNOObject
	if u, err := h.cfg.Dynamic.Resource(cnoNetworks).Get(ctx, CNOObject, metav1.GetOptions{}); err == nil {
		typ, _, _ := unstructured.NestedString(u.Object, "spec", "defaultNetwork", "type")
		port, found, _ := unstructured.NestedInt64(u.Object, "spec", "defaultNetwork", "openshiftSDNConfig", "vxlanPort")
		p := "unset (4789)"
		if found {
			p = fmt.Sprint(port)
		}
		what = fmt.Sprintf("its Network %s: defaultNetwork.type %q, openshiftSDNConfig.vxlanPort %s", CNOObject, typ, p)
	}
	return fmt.Sprintf("OpenShift 4.x: the Cluster Network Operator is installed (%s, %s). It renders openshift-sdn's ClusterNetwork and DaemonSet from that object "+
		"and refuses any change of vxlanPort (\"cannot change openshift-sdn vxlanPort\"), so a port moved under it is put back at its next reconcile: "+
		"Cutover does not move openshift-sdn's port on OpenShift 4.x (supported: OpenShift 3.11; see docs/openshift-sdn.md)", cnoNetworks.GroupResource(), what)
}
