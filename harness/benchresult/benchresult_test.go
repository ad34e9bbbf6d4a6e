package benchresult_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
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
	v := map[string]any{"rounds": 2, "b": benchresult.MsStats{N: 2, MedianMs: 1.5}, "a": []int{1}}
	p, err := benchresult.Write("x.json", v)
	if err != nil || p != filepath.Join(d, "x.json") {
		t.Fatalf("Write = %q, %v", p, err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
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
	if string(got) != want {
		t.Fatalf("wrote:\n%s\nwant:\n%s", got, want)
	}
	for _, bad := range []string{"", "../x.json", "a/x.json"} {
		if _, err := benchresult.Write(bad, v); err == nil || !strings.Contains(err.Error(), "file name") {
			t.Errorf("Write(%q): %v, want a file name error", bad, err)
		}
	}
	if _, err := benchresult.Write("y.json", func() {}); err == nil {
		t.Error("Write of a func: no error")
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
