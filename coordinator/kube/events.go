package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Event reasons of operation milestones.
const (
	ReasonStarted     = "OperationStarted"
	ReasonPrepared    = "OperationPrepared"
	ReasonCommitted   = "OperationCommitted"
	ReasonConfirmed   = "OperationConfirmed"
	ReasonRollingBack = "OperationRollingBack"
	ReasonSucceeded   = "OperationSucceeded"
	ReasonAborted     = "OperationAborted"
	ReasonRolledBack  = "OperationRolledBack"
	ReasonFailed      = "OperationFailed"
	ReasonHeld        = "OperationHeld"
)

// Recorder creates core/v1 Events about one stable object (the
// coordinator's Lease by default), in order, off the caller's path: an
// operation must never wait on an Event.
type Recorder struct {
	client   kubernetes.Interface
	obj      corev1.ObjectReference
	identity string
	log      *slog.Logger

	mu     sync.Mutex
	closed bool
	queue  chan *corev1.Event
	seq    atomic.Uint32 // keeps names unique within one nanosecond
	wg     sync.WaitGroup
}

// NewRecorder returns a recorder of Events about obj. identity (the pod
// name) goes into each Event's reportingInstance and source.host.
func NewRecorder(client kubernetes.Interface, obj corev1.ObjectReference, identity string, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	r := &Recorder{client: client, obj: obj, identity: identity, log: log, queue: make(chan *corev1.Event, 256)}
	r.wg.Add(1)
	go r.run()
	return r
}

// LeaseRef returns the reference of a Lease, with its UID when it exists
// already, so Events show under `kubectl describe lease`.
func LeaseRef(ctx context.Context, client kubernetes.Interface, namespace, name string) corev1.ObjectReference {
	ref := corev1.ObjectReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: namespace, Name: name}
	if l, err := client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
		ref.UID, ref.ResourceVersion = l.UID, ""
	}
	return ref
}

// Emit queues an Event; when the queue is full the Event is dropped and
// logged.
func (r *Recorder) Emit(eventType, reason, message string) {
	if len(message) > 1024 {
		message = message[:1021] + "..."
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%016x%04x", r.obj.Name, time.Now().UnixNano(), r.seq.Add(1)&0xffff),
			Namespace: r.obj.Namespace,
		},
		InvolvedObject:      r.obj,
		Reason:              reason,
		Message:             message,
		Type:                eventType,
		Source:              corev1.EventSource{Component: "cutover-coordinator", Host: r.identity},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "cutover.dev/coordinator",
		ReportingInstance:   r.identity,
	}
	if ev.Namespace == "" {
		ev.Namespace = metav1.NamespaceDefault
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.log.Warn("event dropped: recorder closed", "reason", reason, "message", message)
		return
	}
	select {
	case r.queue <- ev:
	default:
		r.log.Warn("event dropped: queue full", "reason", reason, "message", message)
	}
}

func (r *Recorder) run() {
	defer r.wg.Done()
	for ev := range r.queue {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := r.client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		cancel()
		if err != nil {
			r.log.Warn("event not recorded", "reason", ev.Reason, "err", err)
		}
	}
}

// Close sends what is queued and stops.
func (r *Recorder) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Milestones wraps a journal Store and turns the transitions of each
// operation's record into Events: every milestone is a journaled
// transition, so the journal is the one place that sees them all, also
// for operations resumed by a new leader.
type Milestones struct {
	coordinator.JournalStore
	rec *Recorder

	mu   sync.Mutex
	last map[string]coordinator.Record
}

// WithMilestones returns s recording milestone Events through rec.
func WithMilestones(s coordinator.JournalStore, rec *Recorder) *Milestones {
	return &Milestones{JournalStore: s, rec: rec, last: map[string]coordinator.Record{}}
}

// Load implements coordinator.JournalStore; loaded records are the baseline, so a resumed
// operation does not announce its start again.
func (m *Milestones) Load() ([]coordinator.Record, error) {
	recs, err := m.JournalStore.Load()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		m.last[r.ID] = r
	}
	return recs, err
}

// Save implements coordinator.JournalStore: the Event follows a successful save only.
func (m *Milestones) Save(r coordinator.Record) error {
	if err := m.JournalStore.Save(r); err != nil {
		return err
	}
	m.mu.Lock()
	prev, seen := m.last[r.ID]
	m.last[r.ID] = r
	m.mu.Unlock()
	for _, e := range milestones(prev, seen, r) {
		m.rec.Emit(e.typ, e.reason, e.msg)
	}
	return nil
}

type milestone struct{ typ, reason, msg string }

// milestones is the transition table, without I/O.
func milestones(prev coordinator.Record, seen bool, r coordinator.Record) []milestone {
	var out []milestone
	add := func(typ, reason, format string, a ...any) {
		out = append(out, milestone{typ, reason, fmt.Sprintf("operation %s: ", r.ID) + fmt.Sprintf(format, a...)})
	}
	if !seen && !r.Terminal() {
		add(corev1.EventTypeNormal, ReasonStarted, "%s of %d node(s) from port %d to %d started", r.Kind, len(r.Nodes), r.FromPort, r.ToPort)
	}
	if r.Step != prev.Step {
		switch {
		case r.Step == "commit" && prev.Step == "prepare":
			add(corev1.EventTypeNormal, ReasonPrepared, "every node prepared port %d; committing", r.ToPort)
		case r.Step == "verify" && prev.Step == "commit":
			add(corev1.EventTypeNormal, ReasonCommitted, "every node flipped to port %d; verifying", r.ToPort)
		case r.Step == "finalize" && prev.Step == "confirm":
			add(corev1.EventTypeNormal, ReasonConfirmed, "every node confirmed port %d; dead-man timers disarmed", r.ToPort)
		case (r.Step == "rollback" || r.Step == "abort") && prev.Step != "rollback" && prev.Step != "abort":
			add(corev1.EventTypeWarning, ReasonRollingBack, "%s to port %d under way", r.Step, r.FromPort)
		}
	}
	if r.Terminal() && (!seen || prev.Outcome != r.Outcome) {
		switch r.Outcome {
		case "succeeded":
			add(corev1.EventTypeNormal, ReasonSucceeded, "%d node(s) moved from port %d to %d", len(r.Nodes), r.FromPort, r.ToPort)
		case "aborted":
			add(corev1.EventTypeWarning, ReasonAborted, "aborted before any node flipped; every node stays on port %d", r.FromPort)
		case "rolled-back":
			add(corev1.EventTypeWarning, ReasonRolledBack, "rolled back; every node is back on port %d", r.FromPort)
		case "held":
			add(corev1.EventTypeNormal, ReasonHeld, "held: %d of %d node(s) send port %d, the others still %d; every node listens on both until a staged cutover to %d switches the rest or a rollback undoes it",
				len(r.Switched), len(r.Nodes), r.ToPort, r.FromPort, r.ToPort)
		default:
			add(corev1.EventTypeWarning, ReasonFailed, "ended %s: an operator must check the nodes (coordctl status %s)", r.Outcome, r.ID)
		}
	}
	return out
}
