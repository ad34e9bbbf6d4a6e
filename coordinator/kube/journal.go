package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The cluster journal is a coordinator.JournalStore, like the file one:
// one interface for both, defined where the coordinator uses it.
var _ coordinator.JournalStore = (*Journal)(nil)

// Labels and annotations on the journal's ConfigMaps.
const (
	LabelPartOf      = "app.kubernetes.io/part-of"
	LabelJournal     = "cutover.dev/journal"
	AnnotOperation   = "cutover.dev/operation-id"
	AnnotWriter      = "cutover.dev/writer"
	AnnotReportDrop  = "cutover.dev/report-dropped"
	recordKey        = "record.json"
	defaultMaxRecord = 900 << 10 // under the 1 MiB object limit with room for metadata
)

// JournalConfig says where the journal lives.
type JournalConfig struct {
	Namespace string        // of the ConfigMaps (the coordinator's own)
	Name      string        // journal name: ConfigMaps are <Name>-op-<id>-<hash>
	Identity  string        // this coordinator (pod name): written into every record
	Keep      int           // terminal operations kept; older ones are deleted (coordinator.Prunable); set from --journal-keep
	Timeout   time.Duration // per API call
	// MaxRecordBytes caps one record; above it the report (the only part
	// that grows with the cluster) is dropped from the journal, never the
	// fields a new leader needs to resume. 0 means 900 KiB.
	MaxRecordBytes int
	// OnConflict is called when a write is refused because another
	// coordinator wrote the operation since this one last read it: this
	// one is no longer the leader and must stop issuing commands. The
	// wiring cancels the coordinator's context here.
	OnConflict func(error)
	Log        *slog.Logger
}

// DefaultJournal returns the defaults.
func DefaultJournal() JournalConfig {
	return JournalConfig{Namespace: "cutover", Name: "cutover-journal", Keep: coordinator.DefaultJournalKeep, Timeout: 10 * time.Second}
}

// Validate checks c.
func (c JournalConfig) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("journal namespace: empty"))
	}
	if !dnsLabel(c.Name) || len(c.Name) > 100 {
		errs = append(errs, fmt.Errorf("journal name %q: want a DNS label of at most 100 characters (lowercase letters, digits, '-')", c.Name))
	}
	if c.Identity == "" {
		errs = append(errs, errors.New("journal identity: empty: give the pod name"))
	}
	if c.Keep < 1 {
		errs = append(errs, fmt.Errorf("journal keep %d: want at least 1 finished operation kept", c.Keep))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("journal timeout %s: want > 0", c.Timeout))
	}
	return errors.Join(errs...)
}

func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0 && i < len(s)-1
		if !ok {
			return false
		}
	}
	return true
}

// ConflictError is a journal write refused because someone else wrote the
// operation's record since this coordinator last read it.
type ConflictError struct {
	Operation string
	ConfigMap string // namespace/name
	Writer    string // the other writer, from its annotation, if known
	Err       error
}

func (e *ConflictError) Error() string {
	w := e.Writer
	if w == "" {
		w = "another coordinator"
	}
	return fmt.Sprintf("journal: operation %s: ConfigMap %s was written by %s since this coordinator read it: this coordinator is no longer the leader and must stop: %v",
		e.Operation, e.ConfigMap, w, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }

// IsConflict reports whether err is (or wraps) a ConflictError.
func IsConflict(err error) bool {
	var ce *ConflictError
	return errors.As(err, &ce)
}

// Journal keeps one ConfigMap per operation. Every write carries the
// resourceVersion this coordinator last saw, so a deposed leader's late
// write fails instead of overwriting its successor's. One ConfigMap per
// operation (not one for all) keeps each object far under the 1 MiB limit
// and lets old operations be pruned one by one.
type Journal struct {
	ctx    context.Context
	client kubernetes.Interface
	cfg    JournalConfig

	mu sync.Mutex
	rv map[string]string // ConfigMap name → resourceVersion last read or written by us
}

// NewJournal returns the journal. ctx bounds every API call: pass the
// leadership's context so that writes stop with it.
func NewJournal(ctx context.Context, client kubernetes.Interface, cfg JournalConfig) (*Journal, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = defaultMaxRecord
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Journal{ctx: ctx, client: client, cfg: cfg, rv: map[string]string{}}, nil
}

// ConfigMapName is the ConfigMap holding operation id's record. Operation
// ids allow upper case and '_', ConfigMap names do not: the id is folded
// and a hash of the exact id keeps folded ids apart.
func (j *Journal) ConfigMapName(id string) string {
	h := sha256.Sum256([]byte(id))
	var b strings.Builder
	for _, r := range strings.ToLower(id) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return fmt.Sprintf("%s-op-%s-%s", j.cfg.Name, b.String(), hex.EncodeToString(h[:4]))
}

func (j *Journal) selector() string {
	return LabelPartOf + "=cutover," + LabelJournal + "=" + j.cfg.Name
}

// encode returns the record's bytes, without the report if it is too big.
func (j *Journal) encode(r coordinator.Record) (data []byte, dropped string, err error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, "", fmt.Errorf("journal: operation %s: %w", r.ID, err)
	}
	if len(b) <= j.cfg.MaxRecordBytes {
		return b, "", nil
	}
	full := len(b)
	r.Report = nil
	if b, err = json.Marshal(r); err != nil {
		return nil, "", fmt.Errorf("journal: operation %s: %w", r.ID, err)
	}
	if len(b) > j.cfg.MaxRecordBytes {
		return nil, "", fmt.Errorf("journal: operation %s: record of %d bytes without its report still exceeds the %d-byte limit (%d nodes)", r.ID, len(b), j.cfg.MaxRecordBytes, len(r.Nodes))
	}
	return b, fmt.Sprintf("the report made the record %d bytes, over the %d-byte limit", full, j.cfg.MaxRecordBytes), nil
}

func (j *Journal) build(r coordinator.Record) (*corev1.ConfigMap, error) {
	b, dropped, err := j.encode(r)
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: j.ConfigMapName(r.ID), Namespace: j.cfg.Namespace,
			Labels:      map[string]string{LabelPartOf: "cutover", LabelJournal: j.cfg.Name},
			Annotations: map[string]string{AnnotOperation: r.ID, AnnotWriter: j.cfg.Identity},
		},
		Data: map[string]string{recordKey: string(b)},
	}
	if dropped != "" {
		cm.Annotations[AnnotReportDrop] = dropped
	}
	return cm, nil
}

// Save writes r: create on the first save of an operation, then update
// at the resourceVersion last seen. A write whose outcome was lost (a
// timeout after the server applied it) is recognised by our own writer
// annotation and adopted once; any other conflict is a ConflictError, and
// OnConflict is called.
func (j *Journal) Save(r coordinator.Record) error {
	if err := j.ctx.Err(); err != nil {
		// Checked here too, not only by the client: a write that still
		// reaches the apiserver after leadership ended is what fencing
		// is for.
		return fmt.Errorf("journal: operation %s not written: this coordinator's leadership ended: %w", r.ID, err)
	}
	cm, err := j.build(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(j.ctx, j.cfg.Timeout)
	defer cancel()
	cms := j.client.CoreV1().ConfigMaps(j.cfg.Namespace)
	j.mu.Lock()
	defer j.mu.Unlock()
	rv, known := j.rv[cm.Name]
	for attempt := 0; ; attempt++ {
		var got *corev1.ConfigMap
		if !known {
			got, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		} else {
			cm.ResourceVersion = rv
			got, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			j.rv[cm.Name] = got.ResourceVersion
			if r.Terminal() {
				j.pruneLocked(ctx)
			}
			return nil
		}
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("journal: operation %s: write ConfigMap %s/%s: %w", r.ID, j.cfg.Namespace, cm.Name, err)
		}
		cur, gerr := cms.Get(ctx, cm.Name, metav1.GetOptions{})
		writer := ""
		if gerr == nil {
			writer = cur.Annotations[AnnotWriter]
		}
		if attempt == 0 && gerr == nil && writer == j.cfg.Identity && j.lostWrite(cur, known, rv) {
			rv, known = cur.ResourceVersion, true
			continue
		}
		if gerr != nil && !apierrors.IsNotFound(gerr) {
			return fmt.Errorf("journal: operation %s: write ConfigMap %s/%s: %w (and reading it back: %w)", r.ID, j.cfg.Namespace, cm.Name, err, gerr)
		}
		ce := &ConflictError{Operation: r.ID, ConfigMap: j.cfg.Namespace + "/" + cm.Name, Writer: writer, Err: err}
		if j.cfg.OnConflict != nil {
			j.cfg.OnConflict(ce)
		}
		return ce
	}
}

// lostWrite reports whether cur, written by our identity, is a write of
// ours whose answer we never got: either we never learned any version
// (a Create that timed out) or cur is a later version than the one we
// hold (an Update that timed out). resourceVersions are opaque; only
// inequality is used.
func (j *Journal) lostWrite(cur *corev1.ConfigMap, known bool, rv string) bool {
	return !known || cur.ResourceVersion != rv
}

// Load returns every journaled operation, oldest first, and remembers
// their versions so the next Save of each continues from here.
func (j *Journal) Load() ([]coordinator.Record, error) {
	ctx, cancel := context.WithTimeout(j.ctx, j.cfg.Timeout)
	defer cancel()
	list, err := j.client.CoreV1().ConfigMaps(j.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: j.selector()})
	if err != nil {
		return nil, fmt.Errorf("journal: list ConfigMaps in %s (selector %s): %w", j.cfg.Namespace, j.selector(), err)
	}
	var recs []coordinator.Record
	var errs []error
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, cm := range list.Items {
		var r coordinator.Record
		dec := json.NewDecoder(bytes.NewReader([]byte(cm.Data[recordKey])))
		if err := dec.Decode(&r); err != nil {
			errs = append(errs, fmt.Errorf("journal: ConfigMap %s/%s key %s: not a record: %w", cm.Namespace, cm.Name, recordKey, err))
			continue
		}
		if want := j.ConfigMapName(r.ID); want != cm.Name {
			errs = append(errs, fmt.Errorf("journal: ConfigMap %s/%s holds operation %q, whose ConfigMap is %s: ignored", cm.Namespace, cm.Name, r.ID, want))
			continue
		}
		j.rv[cm.Name] = cm.ResourceVersion
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b coordinator.Record) int { return int(a.Seq - b.Seq) })
	return recs, errors.Join(errs...)
}

// pruneLocked deletes the oldest terminal operations beyond Keep, each at
// the version read, so a record another coordinator just rewrote
// survives. Failures are only logged: pruning is housekeeping.
func (j *Journal) pruneLocked(ctx context.Context) {
	cms := j.client.CoreV1().ConfigMaps(j.cfg.Namespace)
	list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: j.selector()})
	if err != nil {
		j.cfg.Log.Warn("journal prune: list", "err", err)
		return
	}
	byID := map[string]corev1.ConfigMap{}
	var recs []coordinator.Record
	for _, cm := range list.Items {
		var r coordinator.Record
		if json.Unmarshal([]byte(cm.Data[recordKey]), &r) == nil && j.ConfigMapName(r.ID) == cm.Name {
			byID[r.ID] = cm
			recs = append(recs, r)
		}
	}
	for _, r := range coordinator.Prunable(recs, j.cfg.Keep) {
		cm := byID[r.ID]
		rv := cm.ResourceVersion
		err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			j.cfg.Log.Warn("journal prune: delete", "configmap", cm.Name, "err", err)
			continue
		}
		delete(j.rv, cm.Name)
	}
}
