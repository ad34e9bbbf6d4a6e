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
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
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

// shippedBinaries are the commands that go into the images and onto nodes.
var shippedBinaries = []string{"./agent/cmd/agent", "./coordinator/cmd/coordinator", "./coordinator/cmd/coordctl", "./coordinator/cmd/kubectl-cutover"}

// harnessDeps are the test-harness and testing packages among a binary's
// deps: what a shipped binary must not link (STYLE.md habit 16). The lab,
// its OVS processes and the SDN simulator exec and create namespaces; they
// have no business in a privileged agent or in the coordinator image.
func harnessDeps(deps []string) []string {
	return forbiddenDeps(deps, module+"/harness", "testing")
}

func TestShippedBinariesLinkNoHarness(t *testing.T) {
	for _, bin := range shippedBinaries {
		deps := goListDeps(t, bin)
		if len(deps) < 10 {
			t.Fatalf("%s: go list returned only %d deps; the check would prove nothing", bin, len(deps))
		}
		if bad := harnessDeps(deps); len(bad) > 0 {
			t.Errorf("%s links test harness packages (move what it needs out of harness/, or the command into it): %v", bin, bad)
		}
	}
}

// The lab's binary is harness by design: the check must flag it, on the
// real dependency list rather than a made-up one.
func TestHarnessDepsCheckFailsOnLabBinary(t *testing.T) {
	bad := harnessDeps(goListDeps(t, "./harness/cmd/cutover-lab"))
	if !slices.Contains(bad, module+"/harness/lab") {
		t.Fatalf("harnessDeps(cutover-lab) = %v, want it to report %s/harness/lab", bad, module)
	}
	if bad := harnessDeps([]string{"testing", "testing/fstest", module + "/harnessx", "fmt"}); fmt.Sprint(bad) != "[testing testing/fstest]" {
		t.Fatalf("harnessDeps = %v", bad)
	}
}

// harnessImports returns "file: import" for every non-test Go file under
// root that imports a package of module/harness.
func harnessImports(root string) ([]string, error) {
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); len(forbiddenDeps([]string{p}, module+"/harness")) > 0 {
				bad = append(bad, path+": "+p)
			}
		}
		return nil
	})
	return bad, err
}

// pkg/ holds what the binaries ship: its code may not lean on the harness,
// even where no binary links that package yet. Its tests may (testenv).
func TestPkgImportsNoHarness(t *testing.T) {
	bad, err := harnessImports("pkg")
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("non-test files under pkg/ import the test harness: %v", bad)
	}
}

func TestHarnessImportsCheckFails(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{
		"x.go":      "package x\n\nimport _ \"" + module + "/harness/testenv\"\n",
		"x_test.go": "package x\n\nimport _ \"" + module + "/harness/lab\"\n", // tests may
		"y.go":      "package x\n\nimport _ \"" + module + "/harnessx\"\n",    // another tree
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad, err := harnessImports(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "x.go") + ": " + module + "/harness/testenv"; fmt.Sprint(bad) != "["+want+"]" {
		t.Fatalf("harnessImports = %v, want [%s]", bad, want)
	}
}

// faultInjectTag is the build tag that compiles the test-only mutations
// the bite tests set (faultinject.go in agent/, agent/probe,
// coordinator/internal/runner, coordinator/machineconfig; never in the
// barrier core, whose bite tests mutate their simulations instead). Only
// tests and the lab's test harness set it.
const faultInjectTag = testenv.FaultInjectTag

// faultInjectFiles returns the faultinject.go files, as import path/file,
// of the packages the shipped binaries link, built with tags.
func faultInjectFiles(t *testing.T, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps", "-f", `{{range .GoFiles}}{{if eq . "faultinject.go"}}{{$.ImportPath}}/{{.}} {{end}}{{end}}`}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, shippedBinaries...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %v: %v", shippedBinaries, err)
	}
	return strings.Fields(string(out))
}

// shipMentions returns the files among the shipped build's recipes
// (Makefile, Dockerfiles, deploy/) that mention the fault-injection tag.
func shipMentions(files map[string]string) []string {
	var bad []string
	for name, text := range files {
		if strings.Contains(text, faultInjectTag) {
			bad = append(bad, name)
		}
	}
	sort.Strings(bad)
	return bad
}

// The shipped binaries cannot carry a test-only mutation: their default
// build compiles no faultinject.go, and no recipe that builds or deploys
// them sets the tag. The tagged build does compile the agent's and the
// coordinator's (so the check would see them).
func TestShippedBinariesHaveNoFaultInjection(t *testing.T) {
	if got := faultInjectFiles(t, ""); len(got) != 0 {
		t.Errorf("the default build of the shipped binaries compiles %v", got)
	}
	tagged := faultInjectFiles(t, faultInjectTag)
	if slices.ContainsFunc(tagged, func(f string) bool { return strings.HasPrefix(f, module+"/coordinator/internal/barrier/") }) {
		t.Errorf("the decision core carries a test-only switch: %v", tagged)
	}
	for _, side := range []string{module + "/agent/", module + "/coordinator/"} {
		if !slices.ContainsFunc(tagged, func(f string) bool { return strings.HasPrefix(f, side) }) {
			t.Fatalf("the %s build compiles %v, nothing under %s: the check would prove nothing", faultInjectTag, tagged, side)
		}
	}
	files := map[string]string{}
	for _, p := range []string{"Makefile", "Dockerfile.agent", "Dockerfile.coordinator"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = string(b)
	}
	err := filepath.WalkDir("deploy", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad := shipMentions(files); len(bad) > 0 {
		t.Errorf("shipped build recipes mention %s: %v", faultInjectTag, bad)
	}
}

func TestShipMentionsCheckFails(t *testing.T) {
	bad := shipMentions(map[string]string{"Dockerfile.agent": "go build -tags " + faultInjectTag + " ./agent/cmd/agent", "Makefile": "build:"})
	if fmt.Sprint(bad) != "[Dockerfile.agent]" {
		t.Fatalf("shipMentions = %v", bad)
	}
}

// trackerCitation matches what only the project's tracker or its folder
// of field reports can explain: the word issue or issues followed by a
// number, or a path into that folder. Neither ships with the code, so a
// comment must say the reason itself.
var trackerCitation = regexp.MustCompile(`(?i)\bissues?\s+[0-9]+\b|seeds/`)

// commentCitations parses src as the Go file name and returns
// "name:line: match" for every comment that cites the tracker or the
// field reports' folder.
// The comments of a group are read as one text, so a citation split over
// two lines is found too; only comments are read, never code or strings.
func commentCitations(name string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var bad []string
	for _, g := range f.Comments {
		var text strings.Builder
		var starts []int // offset in text where each comment begins
		var lines []int  // and the line it is on
		for _, c := range g.List {
			body := strings.TrimPrefix(c.Text, "//")
			if strings.HasPrefix(c.Text, "/*") {
				body = strings.TrimSuffix(strings.TrimPrefix(c.Text, "/*"), "*/")
			}
			starts = append(starts, text.Len())
			lines = append(lines, fset.Position(c.Slash).Line)
			text.WriteString(body)
			text.WriteString("\n")
		}
		s := text.String()
		for _, m := range trackerCitation.FindAllStringIndex(s, -1) {
			i := sort.SearchInts(starts, m[0]+1) - 1
			line := lines[i] + strings.Count(s[starts[i]:m[0]], "\n")
			bad = append(bad, fmt.Sprintf("%s:%d: %q", name, line, strings.Join(strings.Fields(s[m[0]:m[1]]), " ")))
		}
	}
	return bad, nil
}

// Readers of the repository cannot open the issue tracker or the field
// reports: a comment that cites an issue by number explains nothing to
// them. Every
// non-generated Go file's comments say the reason in their own words, or
// point at docs/, which ships with the code.
func TestNoCommentCitesAnIssueOrSeed(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) < 100 {
		t.Fatalf("git ls-files listed only %d Go files; the check would prove nothing", len(files))
	}
	for _, name := range files {
		if strings.HasSuffix(name, ".pb.go") {
			continue // generated: its comments are the .proto file's
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		bad, err := commentCitations(name, src)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, b := range bad {
			t.Errorf("%s: cites the tracker or the field reports; say the reason instead", b)
		}
	}
}

func TestNoCommentCitesCheckFails(t *testing.T) {
	src := `// Package x is a sample.
package x

// Bounded at 10,000 agents (issue 13).
var a = "issue 13 in a string is not a comment"

/* As in seeds/001. */
var b = 1

// The fix for Issues
// 35 and more.
var c = 2

// No citation here: tissue 13, reissue 2.
var d = 3
`
	bad, err := commentCitations("x.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := `[x.go:4: "issue 13" x.go:7: "seeds/" x.go:10: "Issues 35"]`
	if fmt.Sprint(bad) != want {
		t.Fatalf("commentCitations = %v\nwant %s", bad, want)
	}
}
