//go:build tools

// Package tools pins the Kubernetes test tier's tools: kube-apiserver for
// harness/kubetest and kustomize for rendering deploy/. hack/kube-apiserver.sh
// builds the apiserver once per machine; `go run
// sigs.k8s.io/kustomize/kustomize/v5` renders the manifests.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
