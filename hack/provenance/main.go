// Command provenance adds the provenance key (harness/benchresult) to
// results files that were not written by benchresult.Write.
//
//	go run ./hack/provenance stamp FILE...     this run's provenance, now
//	go run ./hack/provenance backfill FILE...  from git history, for files
//	                                           written before files carried it
//
// stamp is for a results file a script assembles (hack/bench-coordinator-ab.sh
// writes coordinator_ab.json from several runs' files). backfill says only
// what git knows: the commit that last wrote the file and its time; the
// cores are this project's machine class (2) and the load is null, with a
// note saying so. Files that carry a provenance already are left alone.
// It must not invent what was not recorded.
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
)

// backfillCores is this project's machine class: the 2-core machine every
// results file before provenance was measured on (docs/benchmarks.md).
const backfillCores = 2

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "stamp" && os.Args[1] != "backfill") {
		fmt.Fprintln(os.Stderr, "usage: provenance stamp|backfill FILE...")
		os.Exit(2)
	}
	for _, f := range os.Args[2:] {
		if err := run(os.Args[1], f); err != nil {
			fmt.Fprintf(os.Stderr, "provenance: %s: %v\n", f, err)
			os.Exit(1)
		}
	}
}

func run(mode, file string) error {
	js, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if benchresult.CheckProvenance(js) == nil {
		fmt.Printf("%s: has its provenance, left alone\n", file)
		return nil
	}
	root, err := gitOut(filepath.Dir(file), "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	var p benchresult.Provenance
	switch mode {
	case "stamp":
		p = benchresult.Collect(root)
	case "backfill":
		if p, err = fromHistory(file); err != nil {
			return err
		}
	}
	out, err := benchresult.Splice(js, p)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s %s\n", file, p.Commit, p.UTC)
	return os.WriteFile(file, append(out, '\n'), 0o644)
}

// fromHistory is the provenance git knows for file: the commit that last
// wrote it and that commit's time.
func fromHistory(file string) (benchresult.Provenance, error) {
	line, err := gitOut(filepath.Dir(file), "log", "-1", "--format=%H %cI", "--", filepath.Base(file))
	if err != nil {
		return benchresult.Provenance{}, err
	}
	hash, when, ok := strings.Cut(line, " ")
	if !ok {
		return benchresult.Provenance{}, fmt.Errorf("not in git history: commit it, or rerun its benchmark")
	}
	t, err := time.Parse(time.RFC3339, when)
	if err != nil {
		return benchresult.Provenance{}, fmt.Errorf("commit time %q: %w", when, err)
	}
	return benchresult.Provenance{
		Commit:  hash,
		UTC:     t.UTC().Format(time.RFC3339),
		Cores:   backfillCores,
		Machine: fmt.Sprintf("linux/amd64, %d cores (this project's machine class; kernel and memory not recorded)", backfillCores),
		Tool:    "not recorded",
		Note: "backfilled from git history; load was not recorded: commit is the one that last wrote this file " +
			"(the run measured that commit's tree, or the tree just before it) and utc its commit time, not the run's",
	}, nil
}

func gitOut(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
