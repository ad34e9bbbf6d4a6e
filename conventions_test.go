// Package cutover_test enforces the repository's conventions (STYLE.md habit
// 13). Each check is a function over data so that it is shown failing on a
// bad input as well as passing on the tree.
package cutover_test

import (
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/cutover-dev/cutover"

// packagesWithoutDoc returns the Go package directories under root in which
// no non-test file carries a package doc comment.
func packagesWithoutDoc(root string) ([]string, error) {
	docs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "testdata", "bin", "tools", "results", ".git", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		docs[dir] = docs[dir] || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
		return nil
	})
	var missing []string
	for dir, ok := range docs {
		if !ok {
			missing = append(missing, dir)
		}
	}
	sort.Strings(missing)
	return missing, err
}

func TestEveryPackageHasADoc(t *testing.T) {
	missing, err := packagesWithoutDoc(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("packages without a package doc comment (say what the package owns and what it must not do): %v", missing)
	}
}

func TestPackageDocCheckFailsOnUndocumentedPackage(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bare"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bare", "x.go"), []byte("package bare\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing, err := packagesWithoutDoc(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || filepath.Base(missing[0]) != "bare" {
		t.Fatalf("check did not flag an undocumented package: %v", missing)
	}
}

// forbiddenDeps returns the dependencies in deps that a binary must not link.
func forbiddenDeps(deps []string, forbiddenPrefixes ...string) []string {
	var bad []string
	for _, d := range deps {
		for _, p := range forbiddenPrefixes {
			if d == p || strings.HasPrefix(d, p+"/") {
				bad = append(bad, d)
			}
		}
	}
	return bad
}

func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-json="+"ImportPath", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var deps []string
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct{ ImportPath string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		deps = append(deps, p.ImportPath)
	}
	return deps
}

// The agent runs privileged on every node: it must not carry the
// coordinator's code (a smaller, auditable binary; no accidental coupling).
func TestAgentBinaryLinksNoCoordinatorPackage(t *testing.T) {
	if _, err := os.Stat("agent/cmd/agent/main.go"); err != nil {
		t.Skip("agent binary not present yet")
	}
	deps := goListDeps(t, "./agent/cmd/agent")
	if len(deps) < 10 {
		t.Fatalf("go list returned only %d deps; the check would prove nothing", len(deps))
	}
	if bad := forbiddenDeps(deps, module+"/coordinator", module+"/proto/coordinator"); len(bad) > 0 {
		t.Errorf("the agent binary links coordinator packages: %v", bad)
	}
}

func TestForbiddenDepsCheckFails(t *testing.T) {
	bad := forbiddenDeps([]string{"fmt", module + "/coordinator/internal/barrier", module + "/coordinatorx"}, module+"/coordinator")
	if fmt.Sprint(bad) != "["+module+"/coordinator/internal/barrier]" {
		t.Fatalf("forbiddenDeps = %v", bad)
	}
}
