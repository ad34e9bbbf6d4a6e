package model

import (
	"cmp"
	"encoding/json"
	"slices"
	"time"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Record is what the journal keeps of one operation: enough for a
// restarted coordinator to finish or undo it. It is rewritten whole at
// every transition.
type Record struct {
	ID         string          `json:"id"`
	Kind       string          `json:"kind"` // "cutover" or "rollback"
	FromPort   tunnelport.Port `json:"from_port"`
	ToPort     tunnelport.Port `json:"to_port"`
	Nodes      []string        `json:"nodes"`
	StepMillis int64           `json:"step_millis"`
	Step       string          `json:"step"`        // barrier step in flight, "done" when terminal
	CommitSent bool            `json:"commit_sent"` // from here on undoing is a rollback
	Outcome    string          `json:"outcome"`     // barrier outcome
	Report     json.RawMessage `json:"report,omitempty"`
	Seq        int64           `json:"seq"` // start order, for "the last operation"
	// Hooks are the hook calls made so far: a resumed operation never
	// repeats a BeforeCommit and knows which hooks to Restore.
	Hooks []HookMark `json:"hooks,omitempty"`
	// Batches are a staged operation's batches (empty: atomic): a
	// restarted coordinator rebuilds the same plan.
	Batches [][]string `json:"batches,omitempty"`
	// MaxParallel is a staged operation's wave size, resolved: a restarted
	// coordinator changes nodes as many at a time as the first one did.
	MaxParallel int `json:"max_parallel,omitempty"`
	// Switched are, for a Held staged operation, the nodes that send the
	// new port (every batch of every run so far): the next run switches
	// the others.
	Switched []string `json:"switched,omitempty"`
}

// Terminal reports whether the operation ended.
// A Held operation's run ended, but the operation did not: it is never
// pruned.
func (r Record) Terminal() bool { return r.Outcome != "" && r.Outcome != "pending" }

// Held reports whether the record is a held staged operation.
func (r Record) Held() bool { return r.Outcome == "held" }

// StepTimeout is the operation's per-step deadline.
func (r Record) StepTimeout() time.Duration { return time.Duration(r.StepMillis) * time.Millisecond }

// JournalStore keeps operation records: the file journal (Journal) or a
// cluster one (coordinator/kube's ConfigMaps). Save replaces the record of
// r.ID whole and must be durable when it returns; Load returns every
// record, oldest first.
type JournalStore interface {
	Save(Record) error
	Load() ([]Record, error)
}

// DefaultJournalKeep is how many finished operations the journal keeps
// (--journal-keep). A record is a few KB: a hundred is well under a MB
// of files or ConfigMaps, and enough history to roll back or inspect.
const DefaultJournalKeep = 100

// Prunable returns the records a journal keeping keep finished operations
// drops: the terminal ones, oldest first, beyond the newest keep. An
// operation that has not ended is never dropped, whatever its age: it is
// what a restarted coordinator must finish or undo. The file journal, the
// cluster journal and the coordinator's memory all prune by this rule.
func Prunable(recs []Record, keep int) []Record {
	var done []Record
	for _, r := range recs {
		if r.Terminal() && !r.Held() {
			done = append(done, r)
		}
	}
	if keep < 0 || len(done) <= keep {
		return nil
	}
	slices.SortStableFunc(done, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	return done[:len(done)-keep]
}
