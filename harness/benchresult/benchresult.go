// Package benchresult is what the benchmarks share to report figures: order
// statistics over a sample of durations, the results directory and the JSON
// file writer. It owns the conventions of results/*.json (the directory, the
// indentation, the trailing newline, millisecond figures, and the
// provenance every file starts with: commit, time, machine and load) so
// that every benchmark's file reads the same and says what it measured.
//
// It must not measure anything itself nor decide what a benchmark records:
// each benchmark keeps its own file name and field names, which docs and
// scripts refer to.
package benchresult

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Summary holds order statistics of a sample of durations.
//
// A quantile q is the element at index floor(q·N) of the sorted sample
// (capped at the last one): the value with floor(q·N) samples below it. The
// median of an even sample is so the upper of the two middle values.
type Summary struct {
	N                          int
	Min, Median, P90, P99, Max time.Duration
}

// Summarize returns the statistics of ds; the zero Summary for an empty one.
// ds is not modified.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(num int) time.Duration { return s[min(len(s)*num/100, len(s)-1)] }
	return Summary{N: len(s), Min: s[0], Median: q(50), P90: q(90), P99: q(99), Max: s[len(s)-1]}
}

// MsStats is a Summary as the benchmarks write it: milliseconds with
// microsecond resolution, in this field order.
type MsStats struct {
	N        int     `json:"n"`
	MedianMs float64 `json:"medianMs"`
	P90Ms    float64 `json:"p90Ms"`
	MinMs    float64 `json:"minMs"`
	MaxMs    float64 `json:"maxMs"`
}

// Ms converts s into milliseconds.
func (s Summary) Ms() MsStats {
	return MsStats{N: s.N, MedianMs: Millis(s.Median), P90Ms: Millis(s.P90), MinMs: Millis(s.Min), MaxMs: Millis(s.Max)}
}

// Ms summarizes ds in milliseconds: Summarize(ds).Ms().
func Ms(ds []time.Duration) MsStats { return Summarize(ds).Ms() }

// Millis is d in milliseconds, truncated to whole microseconds: the
// resolution the figures are written at.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Micros is d in whole microseconds, truncated.
func Micros(d time.Duration) float64 { return float64(d.Microseconds()) }

// EnvDir names the environment variable that overrides the results
// directory. A relative value is taken from the working directory, which
// under go test is the package's directory.
const EnvDir = "CUTOVER_RESULTS"

// Dir returns the results directory, creating it: $CUTOVER_RESULTS when
// set, else results/ in the repository root, the nearest directory at or
// above the working directory that holds go.mod.
func Dir() (string, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "results")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("results directory: %w", err)
	}
	return dir, nil
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("results directory: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("results directory: looking for the repository root: %w", err)
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("results directory: no go.mod in %s or above it; set %s", wd, EnvDir)
		}
	}
}

// Write writes v to the file name in Dir() (WriteFile) and returns its
// path.
func Write(name string, v any) (string, error) {
	if name == "" || filepath.Base(name) != name {
		return "", fmt.Errorf("results file name %q: want a plain file name, no directory", name)
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	return p, WriteFile(p, v)
}

// WriteFile writes v as indented JSON with a trailing newline to path,
// with the run's provenance (Collect, from the repository around the
// working directory) as its first key: Splice says how. Field order is
// stable: structs in declaration order, maps by sorted key
// (encoding/json). It is for benchmarks told their file's path (an
// environment variable); the rest use Write.
func WriteFile(path string, v any) error {
	js, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("results file %s: %w", filepath.Base(path), err)
	}
	root, err := repoRoot()
	if err != nil {
		root = "." // Collect says in its note that git could not tell
	}
	out, err := Splice(js, Collect(root))
	if err != nil {
		return fmt.Errorf("results file %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		return fmt.Errorf("results file: %w", err)
	}
	return nil
}

// TB is the part of testing.TB that Save uses.
type TB interface {
	Helper()
	Fatal(args ...any)
	Logf(format string, args ...any)
}

// Save is Write for a benchmark: it fails tb on an error and logs the path.
func Save(tb TB, name string, v any) {
	tb.Helper()
	p, err := Write(name, v)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("wrote %s", p)
}
