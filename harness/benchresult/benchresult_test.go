package benchresult_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
)

func TestSummarize(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, ms(i))
	}
	rand.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	in := append([]time.Duration(nil), ds...)
	for _, c := range []struct {
		name string
		ds   []time.Duration
		want benchresult.Summary
	}{
		{"empty", nil, benchresult.Summary{}},
		{"one", []time.Duration{ms(7)}, benchresult.Summary{N: 1, Min: ms(7), Median: ms(7), P90: ms(7), P99: ms(7), Max: ms(7)}},
		// Index floor(q·N): the upper middle value, 90 and 99 below p90 and p99.
		{"1..100 shuffled", ds, benchresult.Summary{N: 100, Min: ms(1), Median: ms(51), P90: ms(91), P99: ms(100), Max: ms(100)}},
		{"1..4", []time.Duration{ms(4), ms(2), ms(3), ms(1)}, benchresult.Summary{N: 4, Min: ms(1), Median: ms(3), P90: ms(4), P99: ms(4), Max: ms(4)}},
	} {
		if got := benchresult.Summarize(c.ds); got != c.want {
			t.Errorf("%s: Summarize = %+v, want %+v", c.name, got, c.want)
		}
	}
	for i := range ds {
		if ds[i] != in[i] {
			t.Fatal("Summarize reordered its input")
		}
	}
}

func TestMs(t *testing.T) {
	ds := []time.Duration{1500 * time.Microsecond, 2*time.Millisecond + 999, 250 * time.Microsecond}
	want := benchresult.MsStats{N: 3, MedianMs: 1.5, P90Ms: 2, MinMs: 0.25, MaxMs: 2}
	if got := benchresult.Ms(ds); got != want {
		t.Fatalf("Ms = %+v, want %+v (microsecond resolution)", got, want)
	}
	if got := benchresult.Micros(1500*time.Nanosecond + 2*time.Millisecond); got != 2001 {
		t.Fatalf("Micros = %v, want 2001", got)
	}
}

func TestDirFromEnv(t *testing.T) {
	d := filepath.Join(t.TempDir(), "a", "b")
	t.Setenv(benchresult.EnvDir, d)
	got, err := benchresult.Dir()
	if err != nil || got != d {
		t.Fatalf("Dir = %q, %v; want %q", got, err, d)
	}
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		t.Fatalf("Dir did not create %s: %v", d, err)
	}
}

func TestDirAtRepoRoot(t *testing.T) {
	t.Setenv(benchresult.EnvDir, "")
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deep := filepath.Join(root, "pkg", "x")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(deep)
	got, err := benchresult.Dir()
	if want := filepath.Join(root, "results"); err != nil || got != want {
		t.Fatalf("Dir = %q, %v; want %q", got, err, want)
	}
}

func TestDirWithoutRepo(t *testing.T) {
	t.Setenv(benchresult.EnvDir, "")
	t.Chdir(t.TempDir()) // no go.mod above a temporary directory
	if _, err := os.Stat("/go.mod"); err == nil {
		t.Skip("/go.mod exists")
	}
	if _, err := benchresult.Dir(); err == nil || !strings.Contains(err.Error(), benchresult.EnvDir) {
		t.Fatalf("Dir without go.mod: %v, want an error naming %s", err, benchresult.EnvDir)
	}
}

func TestWrite(t *testing.T) {
	d := t.TempDir()
	t.Setenv(benchresult.EnvDir, d)
	t.Setenv(benchresult.EnvTool, "make bench-x")
	v := map[string]any{"rounds": 2, "b": benchresult.MsStats{N: 2, MedianMs: 1.5}, "a": []int{1}}
	p, err := benchresult.Write("x.json", v)
	if err != nil || p != filepath.Join(d, "x.json") {
		t.Fatalf("Write = %q, %v", p, err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// The benchmark's fields follow the provenance as they were: order,
	// indentation and number text.
	wantTail := `,
  "a": [
    1
  ],
  "b": {
    "n": 2,
    "medianMs": 1.5,
    "p90Ms": 0,
    "minMs": 0,
    "maxMs": 0
  },
  "rounds": 2
}
`
	if !strings.HasPrefix(string(got), "{\n  \"provenance\": {\n    \"commit\": ") || !strings.HasSuffix(string(got), wantTail) {
		t.Fatalf("wrote:\n%s\nwant the provenance first, then:\n%s", got, wantTail)
	}
	if err := benchresult.CheckProvenance(got); err != nil {
		t.Fatalf("Write's own file: %v", err)
	}
	var back struct {
		Provenance benchresult.Provenance `json:"provenance"`
		Rounds     int                    `json:"rounds"`
	}
	if err := json.Unmarshal(got, &back); err != nil || back.Rounds != 2 {
		t.Fatalf("read back: %+v, %v", back, err)
	}
	if pr := back.Provenance; pr.Tool != "make bench-x" || pr.Cores != runtime.NumCPU() || pr.Load1 == nil || pr.Load15 == nil ||
		!strings.Contains(pr.Machine, fmt.Sprintf("%d cores", runtime.NumCPU())) {
		t.Errorf("provenance %+v: want the tool from %s, this machine's cores and load", pr, benchresult.EnvTool)
	}
	for _, bad := range []string{"", "../x.json", "a/x.json"} {
		if _, err := benchresult.Write(bad, v); err == nil || !strings.Contains(err.Error(), "file name") {
			t.Errorf("Write(%q): %v, want a file name error", bad, err)
		}
	}
	if _, err := benchresult.Write("y.json", func() {}); err == nil {
		t.Error("Write of a func: no error")
	}
	if _, err := benchresult.Write("z.json", map[string]int{"provenance": 1}); err == nil || !strings.Contains(err.Error(), "provenance") {
		t.Errorf("Write of a value with its own provenance key: %v, want a refusal naming the key", err)
	}
}

// TestWriteWrapsAList: a value that is not an object (a benchmark's rows)
// is written as {"provenance": …, "results": value}, and Read gives the
// value back.
func TestWriteWrapsAList(t *testing.T) {
	t.Setenv(benchresult.EnvDir, t.TempDir())
	type row struct {
		N    int     `json:"n"`
		Lost float64 `json:"lost"`
	}
	rows := []row{{8, 0.5}, {32, 187}}
	p, err := benchresult.Write("rows.json", rows)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	wantTail := `,
  "results": [
    {
      "n": 8,
      "lost": 0.5
    },
    {
      "n": 32,
      "lost": 187
    }
  ]
}
`
	if err := benchresult.CheckProvenance(got); err != nil || !strings.HasSuffix(string(got), wantTail) {
		t.Fatalf("wrote (%v):\n%s\nwant the provenance, then:\n%s", err, got, wantTail)
	}
	var back []row
	if err := benchresult.Read(p, &back); err != nil || len(back) != 2 || back[1] != rows[1] {
		t.Fatalf("Read = %+v, %v; want %+v", back, err, rows)
	}
	// An object's fields are read as they are, the provenance beside them.
	if err := benchresult.WriteFile(p, map[string]int{"results": 3, "other": 4}); err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := benchresult.Read(p, &obj); err != nil || obj["other"] != 4.0 || obj["provenance"] == nil {
		t.Fatalf("Read of an object with a results field: %v, %v", obj, err)
	}
}

func TestSplice(t *testing.T) {
	one := 0.5
	p := benchresult.Provenance{Commit: "abc", UTC: "2026-01-02T03:04:05Z", Cores: 2, Load1: &one, Load5: &one, Load15: &one, Machine: "m", Tool: "t"}
	for _, c := range []struct{ name, in, want string }{
		{"empty object", `{}`, `{
  "provenance": {P}
}`},
		// The number text stays as written (no float reformatting), and
		// the key order is the file's.
		{"object", `{"z": 1.50, "a": [1e3]}`, `{
  "provenance": {P},
  "z": 1.50,
  "a": [
    1e3
  ]
}`},
		{"scalar", `7`, `{
  "provenance": {P},
  "results": 7
}`},
	} {
		pj, _ := json.MarshalIndent(p, "  ", "  ")
		want := strings.ReplaceAll(c.want, "{P}", string(pj))
		got, err := benchresult.Splice([]byte(c.in), p)
		if err != nil || string(got) != want {
			t.Errorf("%s: Splice = %v\n%s\nwant\n%s", c.name, err, got, want)
		}
		if err := benchresult.CheckProvenance(got); err != nil {
			t.Errorf("%s: CheckProvenance of Splice's output: %v", c.name, err)
		}
	}
	if _, err := benchresult.Splice([]byte(`{"a":`), p); err == nil {
		t.Error("Splice of broken JSON: no error")
	}
}

// TestCheckProvenanceFails: each way a results file can lack its
// provenance is named.
func TestCheckProvenanceFails(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`[1]`, "not a JSON object"},
		{`{"rounds": 1, "provenance": {}}`, "first key"},
		{`{"provenance": {"utc": "2026-01-02T03:04:05Z", "cores": 2, "machine": "m", "load1": 1}}`, "no commit"},
		{`{"provenance": {"commit": "a", "utc": "2026-01-02T03:04:05Z", "machine": "m", "load1": 1}}`, "no cores"},
		{`{"provenance": {"commit": "a", "utc": "2026-01-02T03:04:05Z", "cores": 2, "load1": 1}}`, "no machine"},
		{`{"provenance": {"commit": "a", "utc": "2026-01-02T03:04:05Z", "cores": 2, "machine": "m", "load1": null}}`, "no load and no note"},
		{`{"provenance": {"commit": "a", "utc": "yesterday", "cores": 2, "machine": "m", "load1": 1}}`, "utc"},
	} {
		if err := benchresult.CheckProvenance([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckProvenance(%s) = %v, want an error saying %q", c.in, err, c.want)
		}
	}
	ok := `{"provenance": {"commit": "a", "utc": "2026-01-02T03:04:05Z", "cores": 2, "machine": "m", "load1": null, "note": "backfilled"}, "x": 1}`
	if err := benchresult.CheckProvenance([]byte(ok)); err != nil {
		t.Errorf("a backfilled provenance with its note: %v", err)
	}
}

// TestCollectDirty: a change to a tracked file marks the commit dirty; a
// change under results/ or to a doc does not (a run writes those itself).
func TestCollectDirty(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", root, "-c", "user.name=t", "-c", "user.email=t@example.invalid"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	write := func(f, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q")
	write("code.go", "package x\n")
	write("results/r.json", "{}\n")
	write("docs/b.md", "x\n")
	git("add", ".")
	git("commit", "-q", "-m", "x")
	head := git("rev-parse", "HEAD")
	if c := benchresult.Collect(root).Commit; c != head {
		t.Fatalf("clean tree: commit %q, want %q", c, head)
	}
	write("results/r.json", "{\"a\": 1}\n")
	write("docs/b.md", "y\n")
	write("untracked.go", "package x\n")
	if c := benchresult.Collect(root).Commit; c != head {
		t.Fatalf("results, docs and untracked files changed: commit %q, want %q", c, head)
	}
	write("code.go", "package y\n")
	if c := benchresult.Collect(root).Commit; c != head+"-dirty" {
		t.Fatalf("tracked code changed: commit %q, want %q", c, head+"-dirty")
	}
	if p := benchresult.Collect(t.TempDir()); p.Commit != "unknown" || !strings.Contains(p.Note, "git") {
		t.Fatalf("outside a repository: %+v, want commit unknown and a note naming git", p)
	}
	// A bundle's commit wins over the tree's (dirty here): its binaries
	// were built from it, and outside a repository too.
	t.Setenv(benchresult.EnvCommit, "0123abc")
	for _, dir := range []string{root, t.TempDir()} {
		if p := benchresult.Collect(dir); p.Commit != "0123abc" || !strings.Contains(p.Note, benchresult.EnvCommit) {
			t.Fatalf("%s with %s set: %+v, want the bundle's commit and a note naming it", dir, benchresult.EnvCommit, p)
		}
	}
}

type fakeTB struct {
	fatal []any
	logs  []string
}

func (f *fakeTB) Helper()                         {}
func (f *fakeTB) Fatal(args ...any)               { f.fatal = append(f.fatal, args...) }
func (f *fakeTB) Logf(format string, args ...any) { f.logs = append(f.logs, format) }

func TestSave(t *testing.T) {
	t.Setenv(benchresult.EnvDir, t.TempDir())
	var tb fakeTB
	benchresult.Save(&tb, "ok.json", 1)
	if len(tb.fatal) != 0 || len(tb.logs) != 1 {
		t.Fatalf("Save ok: fatal %v, logs %v", tb.fatal, tb.logs)
	}
	tb = fakeTB{}
	benchresult.Save(&tb, "../bad.json", 1)
	if len(tb.fatal) != 1 {
		t.Fatalf("Save of a bad name: fatal %v", tb.fatal)
	}
}
