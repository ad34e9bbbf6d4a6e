//go:build tools

// Package tools pins the Kubernetes test tiers' tools: kube-apiserver for
// harness/kubetest, kustomize for rendering deploy/, and for the real-cluster
// tier (harness/cluster) the node and control-plane components that run
// beside it: kubelet, kube-controller-manager, kube-scheduler, kube-proxy and
// kubectl, all from the one pinned k8s.io/kubernetes. hack/kube-tools.sh
// builds each once per machine.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
