package machineconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Journal states.
const (
	RolloutRunning   = "Running"
	RolloutSucceeded = "Succeeded"
	RolloutFailed    = "Failed"
	// RolloutStopped: this driver stopped for someone else: another driver
	// wrote the journal meanwhile (then only the report says so), or the
	// MCC came back and takes over (journaled; resumable like Failed).
	RolloutStopped = "Stopped"
)

// journalKey is the ConfigMap key holding the JSON record.
const journalKey = "rollout.json"

// Record is the journaled rollout. The nodes' annotations say which step
// each node is at (Decide); the record adds what they cannot: the target
// and node set a resumed run must keep, when each step began (timeouts
// survive a restart) and what was seen on the way (the reboot).
type Record struct {
	Pool    string                 `json:"pool"`
	Config  string                 `json:"config"`
	Nodes   []string               `json:"nodes"`
	State   string                 `json:"state"`
	Error   string                 `json:"error,omitempty"`
	Started time.Time              `json:"started"`
	Updated time.Time              `json:"updated"`
	Node    map[string]*NodeRecord `json:"node"`
}

// NodeRecord is one node's progress.
type NodeRecord struct {
	Step      Step      `json:"step"`
	Since     time.Time `json:"since"`
	Started   time.Time `json:"started,omitzero"`
	Finished  time.Time `json:"finished,omitzero"`
	Drained   bool      `json:"drained,omitempty"`   // the drain was answered
	SawReboot bool      `json:"sawReboot,omitempty"` // NotReady was seen after the drain answer
}

// journal keeps the Record in a ConfigMap with optimistic concurrency: a
// second driver of the same pool gets a conflict instead of overwriting.
type journal struct {
	c         *Cluster
	namespace string
	name      string
	rv        string
}

// JournalName is the ConfigMap that journals the rollout of pool.
func JournalName(pool string) string { return "cutover-machineconfig-" + pool }

// ErrJournalConflict means another writer changed the journal.
var ErrJournalConflict = errors.New("the journal was changed by another writer: is a second rollout of this pool running?")

func (j *journal) load(ctx context.Context) (*Record, error) {
	cm, err := j.c.Kube.CoreV1().ConfigMaps(j.namespace).Get(ctx, j.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		j.rv = ""
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read journal ConfigMap %s/%s: %w", j.namespace, j.name, err)
	}
	j.rv = cm.ResourceVersion
	var r Record
	if err := json.Unmarshal([]byte(cm.Data[journalKey]), &r); err != nil {
		return nil, fmt.Errorf("journal ConfigMap %s/%s: key %s: %w", j.namespace, j.name, journalKey, err)
	}
	return &r, nil
}

func (j *journal) save(ctx context.Context, r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: j.name, Namespace: j.namespace, ResourceVersion: j.rv,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "coordctl", "cutover.dev/machineconfig-pool": r.Pool}},
		Data: map[string]string{journalKey: string(b)},
	}
	var out *corev1.ConfigMap
	if j.rv == "" {
		out, err = j.c.Kube.CoreV1().ConfigMaps(j.namespace).Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return ErrJournalConflict
		}
	} else {
		out, err = j.c.Kube.CoreV1().ConfigMaps(j.namespace).Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return ErrJournalConflict
		}
	}
	if err != nil {
		return fmt.Errorf("write journal ConfigMap %s/%s: %w", j.namespace, j.name, err)
	}
	j.rv = out.ResourceVersion
	return nil
}
