package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cutover-dev/cutover/coordinator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// versioned returns a fake clientset whose ConfigMaps have the
// apiserver's resourceVersion semantics (the fake tracker has none):
// every write gets a new version, an update at a stale one is a
// Conflict. The real apiserver tests hold the journal to the real thing.
func versioned(objs ...runtime.Object) *fake.Clientset {
	cs := fake.NewClientset(objs...)
	tr := cs.Tracker()
	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")
	var n atomic.Int64
	cs.PrependReactor("create", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		cm := a.(k8stesting.CreateAction).GetObject().(*corev1.ConfigMap).DeepCopy()
		cm.ResourceVersion = strconv.FormatInt(n.Add(1), 10)
		if err := tr.Create(gvr, cm, cm.Namespace); err != nil {
			return true, nil, err
		}
		return true, cm, nil
	})
	cs.PrependReactor("update", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		cm := a.(k8stesting.UpdateAction).GetObject().(*corev1.ConfigMap).DeepCopy()
		cur, err := tr.Get(gvr, cm.Namespace, cm.Name)
		if err != nil {
			return true, nil, err
		}
		if cm.ResourceVersion != cur.(*corev1.ConfigMap).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), cm.Name, errors.New("the object has been modified"))
		}
		cm.ResourceVersion = strconv.FormatInt(n.Add(1), 10)
		if err := tr.Update(gvr, cm, cm.Namespace); err != nil {
			return true, nil, err
		}
		return true, cm, nil
	})
	return cs
}

func journal(t *testing.T, cs *fake.Clientset, identity string, mut ...func(*JournalConfig)) *Journal {
	t.Helper()
	cfg := DefaultJournal()
	cfg.Identity = identity
	for _, m := range mut {
		m(&cfg)
	}
	j, err := NewJournal(context.Background(), cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func rec(id string, seq int64, step, outcome string) coordinator.Record {
	return coordinator.Record{ID: id, Kind: "cutover", FromPort: 4789, ToPort: 4889, Nodes: []string{"a", "b"},
		StepMillis: 5000, Step: step, CommitSent: step == "verify", Outcome: outcome, Seq: seq}
}

func TestJournalRoundTrip(t *testing.T) {
	cs := versioned()
	j := journal(t, cs, "coord-0")
	r2 := rec("Op_2.X", 2, "commit", "pending")
	r2.Report = json.RawMessage(`{"operationId":"Op_2.X"}`)
	for _, r := range []coordinator.Record{r2, rec("op-1", 1, "done", "succeeded")} {
		if err := j.Save(r); err != nil {
			t.Fatal(err)
		}
	}
	r2.Step = "verify"
	if err := j.Save(r2); err != nil {
		t.Fatal(err)
	}
	got, err := journal(t, cs, "coord-1").Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "op-1" || got[1].ID != "Op_2.X" || got[1].Step != "verify" || string(got[1].Report) != `{"operationId":"Op_2.X"}` {
		t.Fatalf("loaded %+v", got)
	}
	name := j.ConfigMapName("Op_2.X")
	if !strings.HasPrefix(name, "cutover-journal-op-op-2-x-") || name == j.ConfigMapName("op-2.x") {
		t.Errorf("ConfigMap name %q (folded ids must not collide)", name)
	}
	cm, err := cs.CoreV1().ConfigMaps("cutover").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Annotations[AnnotOperation] != "Op_2.X" || cm.Annotations[AnnotWriter] != "coord-0" || cm.Labels[LabelJournal] != "cutover-journal" {
		t.Errorf("metadata %v %v", cm.Labels, cm.Annotations)
	}
}

func TestJournalConflictFencesTheOldLeader(t *testing.T) {
	cs := versioned()
	var conflicts []error
	old := journal(t, cs, "coord-0", func(c *JournalConfig) { c.OnConflict = func(err error) { conflicts = append(conflicts, err) } })
	r := rec("op-1", 1, "prepare", "pending")
	if err := old.Save(r); err != nil {
		t.Fatal(err)
	}
	// A new leader takes over and moves the operation on.
	nu := journal(t, cs, "coord-1")
	if _, err := nu.Load(); err != nil {
		t.Fatal(err)
	}
	r.Step = "abort"
	if err := nu.Save(r); err != nil {
		t.Fatal(err)
	}
	// The deposed leader's late write must fail, not undo the abort.
	r.Step = "commit"
	err := old.Save(r)
	if !IsConflict(err) || len(conflicts) != 1 {
		t.Fatalf("late write: %v (conflicts %v)", err, conflicts)
	}
	if !strings.Contains(err.Error(), "was written by coord-1 since this coordinator read it: this coordinator is no longer the leader") {
		t.Errorf("message: %v", err)
	}
	if !apierrors.IsConflict(errors.Unwrap(err)) {
		t.Errorf("does not wrap the apiserver's Conflict: %v", errors.Unwrap(err))
	}
	got, _ := nu.Load()
	if got[0].Step != "abort" {
		t.Errorf("record overwritten: %+v", got[0])
	}
	// The new leader goes on writing.
	r.Step, r.Outcome = "done", "aborted"
	if err := nu.Save(r); err != nil {
		t.Fatal(err)
	}
	// Someone deleting the record is a conflict too: recreating it
	// would resurrect an operation another coordinator pruned.
	_ = cs.CoreV1().ConfigMaps("cutover").Delete(context.Background(), nu.ConfigMapName("op-1"), metav1.DeleteOptions{})
	if err := nu.Save(r); !IsConflict(err) {
		t.Errorf("save after delete: %v", err)
	}
}

func TestJournalAdoptsItsOwnLostWrite(t *testing.T) {
	cs := versioned()
	ctx := context.Background()
	j := journal(t, cs, "coord-0")
	r := rec("op-1", 1, "prepare", "pending")
	if err := j.Save(r); err != nil {
		t.Fatal(err)
	}
	// An update of ours applied but its answer was lost: the object is
	// newer than the version we hold, and carries our name.
	cms := cs.CoreV1().ConfigMaps("cutover")
	cm, _ := cms.Get(ctx, j.ConfigMapName("op-1"), metav1.GetOptions{})
	cm.Data[recordKey] = strings.Replace(cm.Data[recordKey], `"prepare"`, `"commit"`, 1)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.Step = "verify"
	if err := j.Save(r); err != nil {
		t.Fatalf("own lost write not adopted: %v", err)
	}
	// Same for a create whose answer was lost.
	j2 := journal(t, cs, "coord-0")
	if err := j2.Save(rec("op-2", 2, "prepare", "pending")); err != nil {
		t.Fatal(err)
	}
	j3 := journal(t, cs, "coord-0")
	if err := j3.Save(rec("op-2", 2, "commit", "pending")); err != nil {
		t.Fatalf("own lost create not adopted: %v", err)
	}
	got, _ := j.Load()
	if len(got) != 2 || got[0].Step != "verify" || got[1].Step != "commit" {
		t.Errorf("loaded %+v", got)
	}
}

func TestJournalSizeLimit(t *testing.T) {
	cs := versioned()
	j := journal(t, cs, "coord-0", func(c *JournalConfig) { c.MaxRecordBytes = 1000 })
	r := rec("op-big", 1, "verify", "pending")
	r.Report = json.RawMessage(`{"nodes":"` + strings.Repeat("x", 2000) + `"}`)
	if err := j.Save(r); err != nil {
		t.Fatal(err)
	}
	got, _ := j.Load()
	if len(got) != 1 || got[0].Report != nil || got[0].Step != "verify" || got[0].ToPort != 4889 {
		t.Errorf("loaded %+v", got)
	}
	cm, _ := cs.CoreV1().ConfigMaps("cutover").Get(context.Background(), j.ConfigMapName("op-big"), metav1.GetOptions{})
	if !strings.Contains(cm.Annotations[AnnotReportDrop], "over the 1000-byte limit") {
		t.Errorf("annotation %q", cm.Annotations[AnnotReportDrop])
	}
	for i := range 200 {
		r.Nodes = append(r.Nodes, fmt.Sprintf("node-%03d", i))
	}
	if err := j.Save(r); err == nil || !strings.Contains(err.Error(), "without its report still exceeds the 1000-byte limit (202 nodes)") {
		t.Errorf("too big: %v", err)
	}
}

func TestJournalPrune(t *testing.T) {
	cs := versioned()
	j := journal(t, cs, "coord-0", func(c *JournalConfig) { c.Keep = 2 })
	if err := j.Save(rec("running", 10, "prepare", "pending")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		if err := j.Save(rec(fmt.Sprintf("op-%d", i), int64(i), "done", "succeeded")); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := j.Load()
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if strings.Join(ids, ",") != "op-3,op-4,running" {
		t.Errorf("kept %v", ids)
	}
}

func TestJournalStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := DefaultJournal()
	cfg.Identity = "coord-0"
	j, err := NewJournal(ctx, versioned(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := j.Save(rec("op-1", 1, "prepare", "pending")); err == nil {
		t.Error("a journal whose leadership ended still writes")
	}
}

func TestJournalConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*JournalConfig)
		want string
	}{
		{func(c *JournalConfig) { c.Identity = "" }, "journal identity: empty"},
		{func(c *JournalConfig) { c.Name = "Cutover_J" }, `journal name "Cutover_J"`},
		{func(c *JournalConfig) { c.Keep = 0 }, "journal keep 0"},
		{func(c *JournalConfig) { c.Namespace = "" }, "journal namespace: empty"},
	} {
		c := DefaultJournal()
		c.Identity = "x"
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

// TestRunbookSelectorFindsTheJournal: the command docs/runbook.md gives
// to save the journal selects the ConfigMaps the journal writes, and
// nothing but them.
func TestRunbookSelectorFindsTheJournal(t *testing.T) {
	b, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`kubectl -n (\\S+) get cm -l (\\S+) -o yaml > journal.yaml`").FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("docs/runbook.md has no `kubectl -n NS get cm -l SELECTOR -o yaml > journal.yaml`")
	}
	sel, err := labels.Parse(m[2])
	if err != nil {
		t.Fatalf("runbook selector %q: %v", m[2], err)
	}
	cs := versioned(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cutover-coordinator", Namespace: "cutover",
		Labels: map[string]string{LabelPartOf: "cutover"}}})
	j := journal(t, cs, "coord-0")
	for _, r := range []coordinator.Record{rec("op-1", 1, "done", "succeeded"), rec("op-2", 2, "commit", "pending")} {
		if err := j.Save(r); err != nil {
			t.Fatal(err)
		}
	}
	list, err := cs.CoreV1().ConfigMaps(m[1]).List(context.Background(), metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cm := range list.Items {
		got = append(got, cm.Name)
	}
	want := []string{j.ConfigMapName("op-1"), j.ConfigMapName("op-2")}
	slices.Sort(got)
	slices.Sort(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("runbook's `-n %s -l %s` selects %v, want the journal's %v", m[1], m[2], got, want)
	}
}
