// Package kube runs the coordinator inside a Kubernetes cluster: it
// discovers agents from the API (the agent DaemonSet's pods, their host IPs
// and their Nodes' labels) and cross-checks them against the Nodes, elects
// one active coordinator on a coordination.k8s.io Lease, keeps the
// operation journal in ConfigMaps (optimistic concurrency on
// resourceVersion, so a new leader resumes an interrupted operation and a
// deposed one cannot overwrite it), records Kubernetes Events for operation
// milestones, and keeps the CNI's source of truth (flannel's
// kube-flannel-cfg Backend.Port, Calico's FelixConfiguration vxlanPort) in
// step with the dataplane: moved right before the commit, put back if the
// operation is undone (Session implements coordinator.Hook).
//
// It owns only Kubernetes API objects. It must never talk to agents or
// touch a node's dataplane: operations are run by package coordinator,
// which this package feeds through small adapters (Inventory, the journal's
// Save/Load, and Session as a coordinator.Hook).
package kube
