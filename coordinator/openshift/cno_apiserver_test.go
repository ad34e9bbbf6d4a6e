package openshift

// OpenShift 4.x detection against a real kube-apiserver: with the Cluster
// Network Operator's Network CRD served and its `cluster` object present,
// the hook's plan refuses by name and BeforeCommit refuses before the
// ClusterNetwork is touched; without the CRD (OpenShift 3.11) no such
// problem is raised.

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/harness/kubetest"
)

// networkCRD stands in for the CNO's networks.operator.openshift.io
// (manifests/0000_70_network_01_networks.crd.yaml): same group, version,
// kind and scope; the schema is left open.
const networkCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: networks.operator.openshift.io
spec:
  group: operator.openshift.io
  scope: Cluster
  names: {plural: networks, singular: network, kind: Network, listKind: NetworkList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

func cnoLines(problems []string) []string {
	var out []string
	for _, p := range problems {
		if strings.Contains(p, "Cluster Network Operator") {
			out = append(out, p)
		}
	}
	return out
}

func TestOpenShift4DetectedAndRefused(t *testing.T) {
	e := startAPI(t)
	ctx := context.Background()
	e.resetAPI(t, ctx)
	h, err := New(Config{Client: e.cs, Dynamic: e.dyn})
	if err != nil {
		t.Fatal(err)
	}
	op := coordinator.OpInfo{ID: "op-1", Kind: "cutover", FromPort: 4789, ToPort: 4889}
	if _, problems := h.Plan(ctx, op); len(cnoLines(problems)) != 0 {
		t.Fatalf("3.11 (no CNO CRD): problems %q name the CNO", problems)
	}

	if err := e.kc.Apply(ctx, []byte(networkCRD), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	cluster := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "operator.openshift.io/v1", "kind": "Network", "metadata": map[string]any{"name": "cluster"},
		"spec": map[string]any{"defaultNetwork": map[string]any{"type": "OpenShiftSDN",
			"openshiftSDNConfig": map[string]any{"mode": "NetworkPolicy", "vxlanPort": int64(4789)}}},
	}}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) { // until the CRD is established
		if _, err = e.dyn.Resource(cnoNetworks).Create(ctx, cluster, metav1.CreateOptions{}); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("create Network cluster: %v", err)
		}
	}
	var got []string
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) { // until discovery serves it
		_, problems := h.Plan(ctx, op)
		if got = cnoLines(problems); len(got) > 0 || time.Now().After(end) {
			break
		}
	}
	if len(got) != 1 || !strings.Contains(got[0], "networks.operator.openshift.io") ||
		!strings.Contains(got[0], `defaultNetwork.type "OpenShiftSDN", openshiftSDNConfig.vxlanPort 4789`) ||
		!strings.Contains(got[0], "cannot change openshift-sdn vxlanPort") {
		t.Fatalf("4.x: CNO problems %q, want one naming the operator's object, its port and why", got)
	}
	cnBefore, err := e.dyn.Resource(ClusterNetworkGVR).Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.BeforeCommit(ctx, op); err == nil || !strings.Contains(err.Error(), "Cluster Network Operator") {
		t.Fatalf("BeforeCommit on 4.x: %v, want the refusal", err)
	}
	cnAfter, err := e.dyn.Resource(ClusterNetworkGVR).Get(ctx, "default", metav1.GetOptions{})
	if err != nil || cnAfter.GetUID() != cnBefore.GetUID() || cnAfter.GetResourceVersion() != cnBefore.GetResourceVersion() {
		t.Fatalf("the ClusterNetwork changed under a refused BeforeCommit (%v): uid %s→%s, rv %s→%s", err,
			cnBefore.GetUID(), cnAfter.GetUID(), cnBefore.GetResourceVersion(), cnAfter.GetResourceVersion())
	}
}
