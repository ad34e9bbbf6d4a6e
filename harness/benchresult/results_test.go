package benchresult_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cutover-dev/cutover/harness/benchresult"
)

// withoutProvenance returns the results files in dir (*.json) that lack
// their provenance, each with why.
func withoutProvenance(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var bad []string
	for _, f := range files {
		js, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := benchresult.CheckProvenance(js); err != nil {
			bad = append(bad, filepath.Base(f)+": "+err.Error())
		}
	}
	return bad, nil
}

// TestResultsCarryProvenance: every file in the repository's results/
// says the commit, time, machine and load it was measured on (docs quote
// these files; a figure without them cannot be compared or reproduced).
func TestResultsCarryProvenance(t *testing.T) {
	dir := filepath.Join("..", "..", "results")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("results directory: %v", err)
	}
	bad, err := withoutProvenance(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("results/%s: write it with harness/benchresult.Write (its benchmark), or go run ./hack/provenance stamp|backfill", b)
	}
}

func TestProvenanceCheckFailsOnABareFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(benchresult.EnvDir, dir)
	if _, err := benchresult.Write("good.json", []int{1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bare.json"), []byte("[1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad, err := withoutProvenance(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !slices.ContainsFunc(bad, func(s string) bool { return filepath.Base(s[:len("bare.json")]) == "bare.json" }) {
		t.Fatalf("check flagged %v, want bare.json alone", bad)
	}
}
