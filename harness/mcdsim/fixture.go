package mcdsim

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

var (
	mcGVR  = schema.GroupVersionResource{Group: "machineconfiguration.openshift.io", Version: "v1", Resource: "machineconfigs"}
	mcpGVR = schema.GroupVersionResource{Group: "machineconfiguration.openshift.io", Version: "v1", Resource: "machineconfigpools"}
)

// Fixture is a MachineConfigPool whose nodes run Old while the pool's spec
// points at New, both rendered configs owned by the pool as the MCC's
// render controller makes them: the state the field report's rollout
// (docs/machineconfig.md) started from.
type Fixture struct {
	Pool     string
	Nodes    []string
	Old, New string
}

// RoleLabel is the node label the fixture's pool selects.
func RoleLabel(pool string) string { return "node-role.kubernetes.io/" + pool }

// NewPool creates the pool, its two rendered configs and n Ready nodes
// named <pool>-<i>. The CRDs must be served.
func NewPool(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, name string, n int) (Fixture, error) {
	f := Fixture{Pool: name, Old: "rendered-" + name + "-0ld", New: "rendered-" + name + "-new"}
	mcp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"nodeSelector":  map[string]any{"matchLabels": map[string]any{RoleLabel(name): ""}},
			"configuration": map[string]any{"name": f.New},
		},
	}}
	created, err := dyn.Resource(mcpGVR).Create(ctx, mcp, metav1.CreateOptions{})
	if err != nil {
		return f, err
	}
	for i, cfg := range []string{f.Old, f.New} {
		mc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
			"metadata": map[string]any{"name": cfg, "ownerReferences": []any{map[string]any{
				"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
				"name": name, "uid": string(created.GetUID()), "controller": true, "blockOwnerDeletion": true,
			}}},
			"spec": map[string]any{"config": map[string]any{"ignition": map[string]any{"version": "3.4.0"}}},
		}}
		if _, err := dyn.Resource(mcGVR).Create(ctx, mc, metav1.CreateOptions{}); err != nil {
			return f, err
		}
		if i == 0 {
			// creationTimestamp has a one-second resolution: keep "newest" honest.
			time.Sleep(1100 * time.Millisecond)
		}
	}
	for i := range n {
		node := fmt.Sprintf("%s-%d", name, i)
		if err := NewNode(ctx, cs, node, map[string]string{RoleLabel(name): ""}, f.Old); err != nil {
			return f, err
		}
		f.Nodes = append(f.Nodes, node)
	}
	return f, nil
}

// NewNode creates a Ready node settled on cfg (currentConfig = desiredConfig,
// state Done, the last uncordon answered).
func NewNode(ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string, cfg string) error {
	_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: labels,
		Annotations: map[string]string{
			annoCurrent: cfg, annoDesired: cfg, annoState: "Done",
			annoDesiredDrain: "uncordon-" + cfg, annoLastApplied: "uncordon-" + cfg,
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	return SetReady(ctx, cs, name, corev1.ConditionTrue)
}

// WaitServed waits until the MCO's CRDs are served (a moment after they
// are created).
func WaitServed(ctx context.Context, dyn dynamic.Interface, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err1 := dyn.Resource(mcpGVR).List(ctx, metav1.ListOptions{})
		_, err2 := dyn.Resource(mcGVR).List(ctx, metav1.ListOptions{})
		if err1 == nil && err2 == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("MCO CRDs not served after %s: %w", timeout, errors.Join(err1, err2))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
