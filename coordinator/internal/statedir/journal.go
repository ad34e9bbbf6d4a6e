package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/atomicfile"
)

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
func (j *Journal) Save(r model.Record) error {
	b, err := encode(r)
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
	for _, r := range model.Prunable(recs, j.Keep) {
		if err := os.Remove(filepath.Join(j.dir, r.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("journal: prune operation %s: %w", r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Load returns every record, oldest first. Leftover temporary files of an
// interrupted Save (hidden: atomicfile names them "."+base+random, and
// older versions ".tmp-"...) are ignored: the rename never happened.
func (j *Journal) Load() ([]model.Record, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var recs []model.Record
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
		var r model.Record
		if err := json.Unmarshal(b, &r); err != nil {
			errs = append(errs, fmt.Errorf("journal: %s: %w", p, err))
			continue
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b model.Record) int { return int(a.Seq - b.Seq) })
	return recs, errors.Join(errs...)
}

// encode is r as JSON, its fields indented and its report (protojson's
// bytes, already valid JSON) appended as it is: encoding/json would check
// and re-indent the report at every write, 4-8 MB at 10,000 nodes.
func encode(r model.Record) ([]byte, error) {
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
