// Package mcdsim stands in for the node side of OpenShift's machine-config
// update in tests against a real kube-apiserver: a machine-config-daemon per
// node that follows the annotation protocol of
// openshift/machine-config-operator (pkg/daemon: ask for drain-<config>,
// wait for the answer, apply and reboot, ask for uncordon-<config>, wait,
// set currentConfig and state Done), with the reboot shown as the Node
// going NotReady and Ready again; and a kubelet that finishes the graceful
// deletion of evicted pods, which no kubelet does in a bare apiserver.
//
// It owns only the Nodes and Pods it is given. It must not be imported by
// production code.
package mcdsim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The protocol annotations (machine-config-operator pkg/daemon/constants).
const (
	prefix           = "machineconfiguration.openshift.io/"
	annoCurrent      = prefix + "currentConfig"
	annoDesired      = prefix + "desiredConfig"
	annoState        = prefix + "state"
	annoReason       = prefix + "reason"
	annoDesiredDrain = prefix + "desiredDrain"
	annoLastApplied  = prefix + "lastAppliedDrain"
)

// Mode is how the stand-in daemon behaves.
type Mode int

const (
	// Normal follows the protocol to the end.
	Normal Mode = iota
	// Degraded fails validation of a new desiredConfig: state Degraded with
	// Reason, as the MCD does when its on-disk state is not what it expects.
	Degraded
	// Silent never answers: a daemon that is down.
	Silent
	// Rebootless applies the config without a reboot once drained, and
	// then writes currentConfig, state Done and uncordon-<config> in one
	// update, as the MCD's rebootless path does (pkg/daemon/daemon.go).
	Rebootless
)

// MCD is one node's stand-in daemon.
type MCD struct {
	cs     kubernetes.Interface
	node   string
	mode   Mode
	reason string
	reboot time.Duration

	mu      sync.Mutex
	onDisk  string // the config the node runs; survives "reboots"
	reboots int
	errs    []error
}

// Options configure Start.
type Options struct {
	Mode   Mode
	Reason string        // Degraded's reason
	Reboot time.Duration // how long the node stays NotReady (default 200 ms)
	Poll   time.Duration // default 20 ms
}

// Start runs a stand-in daemon for node until ctx ends. The node's
// currentConfig is what it runs at the start.
func Start(ctx context.Context, cs kubernetes.Interface, node string, o Options) (*MCD, error) {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	m := &MCD{cs: cs, node: node, mode: o.Mode, reason: o.Reason, reboot: o.Reboot, onDisk: n.Annotations[annoCurrent]}
	if m.reboot <= 0 {
		m.reboot = 200 * time.Millisecond
	}
	poll := o.Poll
	if poll <= 0 {
		poll = 20 * time.Millisecond
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(poll):
			}
			if err := m.step(ctx); err != nil && ctx.Err() == nil {
				m.mu.Lock()
				m.errs = append(m.errs, err)
				m.mu.Unlock()
			}
		}
	}()
	return m, nil
}

// Reboots is how many times the node rebooted.
func (m *MCD) Reboots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reboots
}

// Errors are the API errors the daemon met (a test asserts there are none).
func (m *MCD) Errors() []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]error(nil), m.errs...)
}

func (m *MCD) annotate(ctx context.Context, kv map[string]string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": kv}})
	_, err := m.cs.CoreV1().Nodes().Patch(ctx, m.node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// step does what the daemon would do on seeing the node now.
func (m *MCD) step(ctx context.Context) error {
	if m.mode == Silent {
		return nil
	}
	n, err := m.cs.CoreV1().Nodes().Get(ctx, m.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	a := n.Annotations
	desired, current := a[annoDesired], a[annoCurrent]
	m.mu.Lock()
	onDisk := m.onDisk
	m.mu.Unlock()
	if desired == "" || (desired == current && onDisk == current) {
		return nil
	}
	if a[annoState] == "Degraded" {
		return nil
	}
	if onDisk != desired {
		if m.mode == Degraded {
			return m.annotate(ctx, map[string]string{annoState: "Degraded", annoReason: m.reason})
		}
		if a[annoState] != "Working" {
			return m.annotate(ctx, map[string]string{annoState: "Working"})
		}
		want := "drain-" + desired
		if a[annoLastApplied] != want {
			if a[annoDesiredDrain] != want {
				return m.annotate(ctx, map[string]string{annoDesiredDrain: want})
			}
			return nil // the controller's turn
		}
		if m.mode == Rebootless {
			m.mu.Lock()
			m.onDisk = desired
			m.mu.Unlock()
			return m.annotate(ctx, map[string]string{annoCurrent: desired, annoState: "Done", annoReason: "", annoDesiredDrain: "uncordon-" + desired})
		}
		// Drained: write the config and reboot.
		if err := m.setReady(ctx, corev1.ConditionFalse); err != nil {
			return err
		}
		m.mu.Lock()
		m.onDisk = desired
		m.reboots++
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.reboot):
		}
		return m.setReady(ctx, corev1.ConditionTrue)
	}
	// Rebooted into desired: ask for the uncordon, then report Done.
	want := "uncordon-" + desired
	if a[annoDesiredDrain] != want {
		return m.annotate(ctx, map[string]string{annoDesiredDrain: want})
	}
	if a[annoLastApplied] != want {
		return nil
	}
	if current != desired {
		return m.annotate(ctx, map[string]string{annoCurrent: desired, annoState: "Done"})
	}
	return nil
}

func (m *MCD) setReady(ctx context.Context, s corev1.ConditionStatus) error {
	return SetReady(ctx, m.cs, m.node, s)
}

// SetReady sets the node's Ready condition.
func SetReady(ctx context.Context, cs kubernetes.Interface, node string, s corev1.ConditionStatus) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	found := false
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = s
			n.Status.Conditions[i].LastTransitionTime = metav1.Now()
			found = true
		}
	}
	if !found {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: s, LastTransitionTime: metav1.Now()})
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s: Ready=%s: %w", node, s, err)
	}
	return nil
}

// Kubelet finishes the graceful deletion of pods (evicted ones) until ctx
// ends, as the kubelets would: a bare apiserver leaves a pod bound to a
// node Terminating forever.
func Kubelet(ctx context.Context, cs kubernetes.Interface, poll time.Duration) {
	zero := int64(0)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(poll):
			}
			l, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, p := range l.Items {
				if p.DeletionTimestamp != nil {
					_ = cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				}
			}
		}
	}()
}
