package machineconfig

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The MCD's annotation protocol, as named in machine-config-operator
// pkg/daemon/constants/constants.go.
const (
	annoPrefix = "machineconfiguration.openshift.io/"

	// AnnoCurrentConfig is written by the MCD when a config is applied.
	AnnoCurrentConfig = annoPrefix + "currentConfig"
	// AnnoDesiredConfig is written by the MCC (by us) to ask for a config.
	AnnoDesiredConfig = annoPrefix + "desiredConfig"
	// AnnoState is the MCD's state: Done, Working, Degraded, Unreconcilable.
	AnnoState = annoPrefix + "state"
	// AnnoReason is the MCD's human-readable reason for a bad state.
	AnnoReason = annoPrefix + "reason"
	// AnnoDesiredDrain is the MCD's request: drain-<config> or uncordon-<config>.
	AnnoDesiredDrain = annoPrefix + "desiredDrain"
	// AnnoLastAppliedDrain is the MCC's answer: the request it completed.
	AnnoLastAppliedDrain = annoPrefix + "lastAppliedDrain"
)

// MCD states (constants.MachineConfigDaemonState*).
const (
	StateDone           = "Done"
	StateWorking        = "Working"
	StateDegraded       = "Degraded"
	StateUnreconcilable = "Unreconcilable"
	StateRebooting      = "Rebooting"
)

// DrainRequest and UncordonRequest are the desiredDrain values the MCD
// writes for config (constants.DrainerStateDrain/Uncordon + "-" + name).
func DrainRequest(config string) string    { return "drain-" + config }
func UncordonRequest(config string) string { return "uncordon-" + config }

// The MCO's API group and the resources this package reads.
var (
	MachineConfigGVR     = schema.GroupVersionResource{Group: "machineconfiguration.openshift.io", Version: "v1", Resource: "machineconfigs"}
	MachineConfigPoolGVR = schema.GroupVersionResource{Group: "machineconfiguration.openshift.io", Version: "v1", Resource: "machineconfigpools"}
)

// The MCC's leader-election Lease: machine-config-operator
// cmd/machine-config-controller (componentName) with
// --resourcelock-namespace set to the operator's namespace by
// manifests/machineconfigcontroller/deployment.yaml.
const (
	MCCNamespace = "openshift-machine-config-operator"
	MCCLease     = "machine-config-controller"
)

// NodeView is what Decide needs to know of a Node: its protocol
// annotations, readiness and cordon.
type NodeView struct {
	Name             string `json:"name"`
	Current          string `json:"currentConfig"`
	Desired          string `json:"desiredConfig"`
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	DesiredDrain     string `json:"desiredDrain"`
	LastAppliedDrain string `json:"lastAppliedDrain"`
	Ready            bool   `json:"ready"`
	Unschedulable    bool   `json:"unschedulable"`
}

// ViewOf reads a NodeView from a Node.
func ViewOf(n *corev1.Node) NodeView {
	a := n.Annotations
	v := NodeView{
		Name: n.Name, Current: a[AnnoCurrentConfig], Desired: a[AnnoDesiredConfig],
		State: a[AnnoState], Reason: a[AnnoReason],
		DesiredDrain: a[AnnoDesiredDrain], LastAppliedDrain: a[AnnoLastAppliedDrain],
		Unschedulable: n.Spec.Unschedulable,
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			v.Ready = c.Status == corev1.ConditionTrue
		}
	}
	return v
}

// Failed reports whether the MCD gave up on the node.
func (v NodeView) Failed() bool {
	return v.State == StateDegraded || v.State == StateUnreconcilable
}
