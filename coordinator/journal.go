package coordinator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/pkg/atomicfile"
)

// Record is what the journal keeps of one operation: enough for a
// restarted coordinator to finish or undo it. It is rewritten whole at
// every transition.
type Record struct {
	ID         string          `json:"id"`
	Kind       string          `json:"kind"` // "cutover" or "rollback"
	FromPort   uint32          `json:"from_port"`
	ToPort     uint32          `json:"to_port"`
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

// stepTimeout is the operation's per-step deadline.
func (r Record) stepTimeout() time.Duration { return time.Duration(r.StepMillis) * time.Millisecond }

// describeJournal names where the journal is, for errors.
func describeJournal(j JournalStore, cfg Config) string {
	if s, ok := j.(fmt.Stringer); ok {
		return s.String()
	}
	if _, ok := j.(*Journal); ok {
		return "--state-dir " + cfg.StateDir
	}
	return fmt.Sprintf("journal %T", j)
}

// DefaultJournalKeep is how many finished operations the journal keeps
// (--journal-keep). A record is a few KB: a hundred is well under a MB
// of files or ConfigMaps, and enough history to roll back or inspect.
const DefaultJournalKeep = 100

// encode is r as JSON, its fields indented and its report (protojson's
// bytes, already valid JSON) appended as it is: encoding/json would check
// and re-indent the report at every write, 4-8 MB at 10,000 nodes.
func (r Record) encode() ([]byte, error) {
	rep := r.Report
	r.Report = nil
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil || len(rep) == 0 {
		return b, err
	}
	// b ends with the object's closing "\n}".
	out := make([]byte, 0, len(b)+len(rep)+16)
	out = append(out, b[:len(b)-2]...)
	out = append(out, ",\n  \"report\": "...)
	out = append(out, rep...)
	return append(out, "\n}"...), nil
}

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

// Journal keeps one file per operation in dir/operations/<id>.json,
// replaced atomically: write a temporary file, fsync it, rename it over
// the old one, fsync the directory. A crash at any point leaves either the
// previous or the new record, never a torn one.
//
// Keep bounds it: when an operation ends, the finished operations beyond
// the newest Keep are deleted (Prunable). 0 keeps everything.
type Journal struct {
	dir  string
	Keep int
}

// OpenJournal creates dir (and its operations/ subdirectory) if needed.
func OpenJournal(dir string) (*Journal, error) {
	d := filepath.Join(dir, "operations")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir %q: %w", dir, err)
	}
	return &Journal{dir: d}, nil
}

// Save persists r durably.
func (j *Journal) Save(r Record) error {
	b, err := r.encode()
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(j.dir, r.ID+".json"), b, 0o600); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if r.Terminal() && j.Keep > 0 {
		return j.prune()
	}
	return nil
}

// prune deletes the records Prunable names. A record that cannot be read
// is left alone (Load reports it).
func (j *Journal) prune() error {
	recs, _ := j.Load()
	var errs []error
	for _, r := range Prunable(recs, j.Keep) {
		if err := os.Remove(filepath.Join(j.dir, r.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("journal: prune operation %s: %w", r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Load returns every record, oldest first. Leftover temporary files of an
// interrupted Save (hidden: atomicfile names them "."+base+random, and
// older versions ".tmp-"...) are ignored: the rename never happened.
func (j *Journal) Load() ([]Record, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var recs []Record
	var errs []error
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(j.dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			errs = append(errs, fmt.Errorf("journal: %s: %w", p, err))
			continue
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b Record) int { return int(a.Seq - b.Seq) })
	return recs, errors.Join(errs...)
}
