package machineconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
)

// mirrorAnnotation marks a static pod's mirror in the API: it cannot be
// evicted (the kubelet owns it), so a drain skips it as kubectl's does.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// DrainConfig says how a node is drained.
type DrainConfig struct {
	// DeleteEmptyDirData allows evicting pods with emptyDir volumes (their
	// data is lost). Without it such a pod refuses the drain before
	// anything is evicted.
	DeleteEmptyDirData bool
	// Retry is the pause between passes: after an eviction refused with 429
	// (a PodDisruptionBudget) and while evicted pods terminate. Default 5 s,
	// the MCC's EvictErrorRetryDelay.
	Retry time.Duration
}

// DrainRefusedError is a drain that cannot start: pods it must not evict.
type DrainRefusedError struct {
	Node string
	Pods []string
}

func (e *DrainRefusedError) Error() string {
	return fmt.Sprintf("node %s: cannot drain: pods with emptyDir volumes would lose their data: %s (give --delete-emptydir-data to evict them anyway)",
		e.Node, strings.Join(e.Pods, ", "))
}

// cordon sets spec.unschedulable.
func (c *Cluster) cordon(ctx context.Context, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := c.Kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: set unschedulable=%t: %w", node, on, err)
	}
	return nil
}

// annotate writes one annotation with a merge patch, so the MCD's own
// annotations, written concurrently, are never overwritten.
func (c *Cluster) annotate(ctx context.Context, node, key, value string) error {
	return c.annotateAll(ctx, node, map[string]string{key: value})
}

func (c *Cluster) annotateAll(ctx context.Context, node string, kv map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": kv}})
	if err != nil {
		return err
	}
	if _, err := c.Kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: set %v: %w", node, kv, err)
	}
	return nil
}

// evictable sorts the node's pods: the ones a drain must evict, and the
// ones with emptyDir data when that is not allowed. DaemonSet pods (their
// controller would recreate them on the cordoned node), mirror pods and
// finished pods are skipped, as the MCC's drain (IgnoreAllDaemonSets) does.
func evictable(pods []corev1.Pod, deleteEmptyDir bool) (evict []corev1.Pod, refused []string) {
	for _, p := range pods {
		if _, ok := p.Annotations[mirrorAnnotation]; ok {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" {
			continue
		}
		if !deleteEmptyDir && slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil }) {
			refused = append(refused, p.Namespace+"/"+p.Name)
			continue
		}
		evict = append(evict, p)
	}
	return evict, refused
}

// drain cordons node and evicts its pods through the Eviction API until
// none is left, retrying evictions a PodDisruptionBudget refuses (429), up
// to deadline. It returns only when the node is cordoned and empty of
// evictable pods, so the answer to the MCD is never premature.
func (c *Cluster) drain(ctx context.Context, node string, cfg DrainConfig, deadline time.Time, note func(string)) error {
	retry := cfg.Retry
	if retry <= 0 {
		retry = 5 * time.Second
	}
	blocked := map[string]string{}
	for {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", node, err)
		}
		if !n.Spec.Unschedulable {
			if err := c.cordon(ctx, node, true); err != nil {
				return err
			}
			note("cordoned")
		}
		l, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
		if err != nil {
			return fmt.Errorf("node %s: list pods: %w", node, err)
		}
		evict, refused := evictable(l.Items, cfg.DeleteEmptyDirData)
		if len(refused) > 0 {
			return &DrainRefusedError{Node: node, Pods: refused}
		}
		if len(evict) == 0 {
			// Uncordoned by someone during the drain? Then pods may have
			// come back: cordon again and look again, as the MCC does.
			n, err := c.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			if n.Spec.Unschedulable {
				return nil
			}
			note("uncordoned by someone else during the drain: cordoning again")
			continue
		}
		var waiting []string
		for _, p := range evict {
			id := p.Namespace + "/" + p.Name
			if p.DeletionTimestamp != nil {
				waiting = append(waiting, id+" (terminating)")
				continue
			}
			err := c.Kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{
				ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
				DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
			})
			switch {
			case err == nil:
				note("evicted " + id)
				delete(blocked, id)
				waiting = append(waiting, id+" (evicted)")
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				// Gone, or replaced by a pod of the same name: the next
				// pass lists it again.
			case apierrors.IsTooManyRequests(err):
				if blocked[id] != err.Error() {
					note(fmt.Sprintf("eviction of %s refused, will retry: %v", id, err))
				}
				blocked[id] = err.Error()
				waiting = append(waiting, id+" (eviction refused: "+err.Error()+")")
			default:
				return fmt.Errorf("node %s: evict %s: %w", node, id, err)
			}
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("node %s: drain timed out; pods left: %s", node, strings.Join(waiting, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
}
