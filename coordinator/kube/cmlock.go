package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Leader locks (--leader-lock).
const (
	// LockLease is a coordination.k8s.io/v1 Lease (Kubernetes 1.14+,
	// OpenShift 4.x).
	LockLease = "lease"
	// LockConfigMap is the record in an annotation of a core/v1
	// ConfigMap, for API servers that serve no Leases (OpenShift 3.11 is
	// Kubernetes 1.11). client-go dropped its own ConfigMap lock (v0.24+).
	LockConfigMap = "configmap"
)

// LeaderAnnotation holds the record on the ConfigMap: the annotation
// client-go's former ConfigMapLock wrote, which OpenShift 3.11's own
// controllers use for theirs, so its tools read ours.
const LeaderAnnotation = "control-plane.alpha.kubernetes.io/leader"

// configMapLock is a resourcelock.Interface on a ConfigMap annotation.
// Every write is an Update carrying the resourceVersion last read (or
// written): two candidates that both saw a free lock cannot both take it,
// the apiserver refuses the second with a Conflict.
type configMapLock struct {
	client          corev1client.ConfigMapsGetter
	namespace, name string
	identity        string

	mu sync.Mutex
	cm *corev1.ConfigMap // as last read or written
}

var _ resourcelock.Interface = (*configMapLock)(nil)

// Get implements resourcelock.Interface: a missing ConfigMap is NotFound
// (the elector then creates it); one without the annotation is a free lock.
func (l *configMapLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	cm, err := l.client.ConfigMaps(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	var rec resourcelock.LeaderElectionRecord
	raw := cm.Annotations[LeaderAnnotation]
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return nil, nil, fmt.Errorf("configmap %s/%s annotation %s: %w", l.namespace, l.name, LeaderAnnotation, err)
		}
	}
	return &rec, []byte(raw), nil
}

// Create implements resourcelock.Interface.
func (l *configMapLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cm, err := l.client.ConfigMaps(l.namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: l.name, Namespace: l.namespace,
		Annotations: map[string]string{LeaderAnnotation: string(raw)},
	}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	return nil
}

// Update implements resourcelock.Interface: on the object last seen, so a
// write by anyone since makes it a Conflict.
func (l *configMapLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	seen := l.cm
	l.mu.Unlock()
	if seen == nil {
		return errors.New("configmap lock: update before get or create")
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cm := seen.DeepCopy()
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[LeaderAnnotation] = string(raw)
	cm, err = l.client.ConfigMaps(l.namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	return nil
}

// RecordEvent implements resourcelock.Interface; the elector's own log
// lines say the same.
func (l *configMapLock) RecordEvent(string) {}

// Identity implements resourcelock.Interface.
func (l *configMapLock) Identity() string { return l.identity }

// Describe implements resourcelock.Interface.
func (l *configMapLock) Describe() string { return "configmap " + l.namespace + "/" + l.name }
