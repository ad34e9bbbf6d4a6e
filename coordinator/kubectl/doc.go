// Package kubectl is the kubectl-cutover plugin's way to the coordinator:
// from the user's kubeconfig it finds the leading coordinator (the live
// holder of its leader lock: the Lease, or the ConfigMap that the openshift
// overlay's --leader-lock=configmap writes), reads coordctl's client
// certificate from the admin Secret the manifests create, and reaches the
// coordinator's gRPC port through the API server's port-forward, so
// `kubectl cutover plan --port 4889` works from an admin workstation with
// nothing else set up.
//
// It only reads (the leader lock, a Pod, a Secret) and port-forwards; every
// command is coordctl's own (coordinator/cli), run over that connection.
// It must not change anything in the cluster.
package kubectl
