package benchresult

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ProvenanceKey is the top-level key every results file carries first:
// where and when its figures were measured. A figure read without it
// cannot be compared with another (a loaded 2-core machine and an idle
// 16-core one differ by more than most changes measure).
const ProvenanceKey = "provenance"

// WrapKey holds a benchmark's value that is not a JSON object (a list of
// rows): the file is then {"provenance": …, "results": value}, so that
// every results file is an object whose first key is its provenance.
const WrapKey = "results"

// EnvTool names the environment variable that says what produced a
// results file (a make target: "make bench-lab"); unset, Collect
// reconstructs the go test command line from the test binary's flags.
const EnvTool = "CUTOVER_BENCH_TOOL"

// Provenance is what a results file says about the run behind it.
type Provenance struct {
	// Commit is git rev-parse HEAD of the tree measured, with "-dirty"
	// when tracked files other than results/ and *.md differed from it
	// (a run that writes several results files, or a benchmark that
	// rewrites its table in docs, changes no code that was measured);
	// "unknown" when git could not say (Note says why).
	Commit string `json:"commit"`
	// UTC is when the file was written, RFC 3339.
	UTC string `json:"utc"`
	// Cores is runtime.NumCPU of the machine.
	Cores int `json:"cores"`
	// Load1, Load5 and Load15 are /proc/loadavg at write time; null when
	// not known (a file backfilled from git history).
	Load1  *float64 `json:"load1"`
	Load5  *float64 `json:"load5"`
	Load15 *float64 `json:"load15"`
	// Machine describes the machine without naming it: OS/arch, kernel,
	// cores and memory.
	Machine string `json:"machine"`
	// Tool is what ran the benchmark: $CUTOVER_BENCH_TOOL, or the go test
	// command line.
	Tool string `json:"tool"`
	// Note says what is missing or estimated, if anything.
	Note string `json:"note,omitempty"`
}

// EnvCommit names the commit a results file records in place of the
// tree's: a bundle (hack/manycore-bundle.sh) measures binaries built from
// the commit it recorded, whatever git says where it runs. The lent
// machine's copy of the tree has git, at the session's first commit with
// later ones as changes: git there named a commit that was not measured.
const EnvCommit = "COT_BENCH_COMMIT"

// Collect returns the provenance of a run in the repository at root, now.
// It never fails: what it cannot read it leaves unknown and names in Note,
// since a benchmark that ran for minutes should not lose its figures to a
// missing git binary.
func Collect(root string) Provenance {
	var notes []string
	p := Provenance{UTC: time.Now().UTC().Format(time.RFC3339), Cores: runtime.NumCPU(), Tool: tool(root)}
	p.Commit = "unknown"
	if c := os.Getenv(EnvCommit); c != "" {
		p.Commit = c
		notes = append(notes, "commit from "+EnvCommit+": the bundle that ran was built from it")
	} else if c, err := gitCommit(root); err != nil {
		notes = append(notes, err.Error())
	} else {
		p.Commit = c
	}
	if l, err := loadavg(); err != nil {
		notes = append(notes, err.Error())
	} else {
		p.Load1, p.Load5, p.Load15 = &l[0], &l[1], &l[2]
	}
	p.Machine = machine(p.Cores)
	p.Note = strings.Join(notes, "; ")
	return p
}

func gitCommit(root string) (string, error) {
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse HEAD in %s: %w", root, err)
	}
	c := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results", ":(exclude)*.md").Output()
	if err != nil {
		return "", fmt.Errorf("git status in %s: %w", root, err)
	}
	if len(bytes.TrimSpace(st)) > 0 {
		c += "-dirty"
	}
	return c, nil
}

func loadavg() ([3]float64, error) {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l, fmt.Errorf("load average: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return l, fmt.Errorf("load average: /proc/loadavg %q: want three figures", b)
	}
	for i := range l {
		if l[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return l, fmt.Errorf("load average: %w", err)
		}
	}
	return l, nil
}

// machine is "linux/amd64, kernel 6.8.0, 2 cores, 23 GiB": what the
// figures depend on, and nothing that names the host.
func machine(cores int) string {
	s := runtime.GOOS + "/" + runtime.GOARCH
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		s += ", kernel " + strings.TrimSpace(string(b))
	}
	s += fmt.Sprintf(", %d cores", cores)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
					s += fmt.Sprintf(", %d GiB", (kb+1<<19)>>20)
				}
			}
		}
	}
	return s
}

// tool is $CUTOVER_BENCH_TOOL, else the go test command that runs this
// test binary's selection from root: the package directory relative to it
// and the -test.run and -test.bench patterns.
func tool(root string) string {
	if t := os.Getenv(EnvTool); t != "" {
		return t
	}
	if !strings.HasSuffix(os.Args[0], ".test") {
		return filepath.Base(os.Args[0])
	}
	pkg := "."
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(root, wd); err == nil && !strings.HasPrefix(rel, "..") {
			pkg = "./" + filepath.ToSlash(rel)
		}
	}
	s := "go test " + pkg
	for _, a := range os.Args[1:] {
		for _, f := range []string{"run", "bench"} {
			if v, ok := strings.CutPrefix(a, "-test."+f+"="); ok {
				s += " -" + f + " '" + v + "'"
			}
		}
	}
	return s
}

// Splice returns js, one JSON value as the benchmark wrote it, with p
// added as its first key, indented as Write indents. An object keeps its
// fields, their order and their number text; any other value (a list of
// rows) is wrapped as {"provenance": p, "results": value}. An object that
// already has a provenance key is refused: the key is this package's.
func Splice(js []byte, p Provenance) ([]byte, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not one JSON value: %w", err)
	}
	pj, err := json.MarshalIndent(p, "  ", "  ")
	if err != nil {
		return nil, err
	}
	obj, isObj := v.(map[string]any)
	prefix := "  " // a wrapped value sits one level down
	if isObj {
		prefix = ""
	}
	var body bytes.Buffer
	if err := json.Indent(&body, bytes.TrimSpace(js), prefix, "  "); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString("{\n  \"" + ProvenanceKey + "\": ")
	out.Write(pj)
	switch {
	case isObj && obj[ProvenanceKey] != nil:
		return nil, fmt.Errorf("the value has a %q key already: it is the provenance this package adds; rename the benchmark's field", ProvenanceKey)
	case isObj && len(obj) == 0:
		out.WriteString("\n}")
	case isObj:
		// body is "{\n  \"a\": …\n}": its fields go between the brace
		// and the closing one.
		b := body.Bytes()
		out.WriteString(",")
		out.Write(b[1 : len(b)-2])
		out.WriteString("\n}")
	default:
		out.WriteString(",\n  \"" + WrapKey + "\": ")
		out.Write(body.Bytes())
		out.WriteString("\n}")
	}
	return out.Bytes(), nil
}

// Read decodes the results file at path into v: a wrapped value's
// "results" (a file that is an object with exactly the keys provenance
// and results), else the whole object, whose provenance key v may ignore.
// Benchmarks that add their runs to an earlier file (one test's rows
// beside another's) read it with Read and write it back with WriteFile.
func Read(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("results file: %w", err)
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) == nil && len(top) == 2 && top[ProvenanceKey] != nil && top[WrapKey] != nil {
		b = top[WrapKey]
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("results file %s: %w", path, err)
	}
	return nil
}

// CheckProvenance returns why js, a results file's content, lacks its
// provenance: it must be an object whose first key is a provenance with a
// commit, a time, cores, a machine and a load or a note saying why not.
func CheckProvenance(js []byte) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("not a JSON object (want {\"%s\": …} first)", ProvenanceKey)
	}
	if t, err := dec.Token(); err != nil || t != ProvenanceKey {
		return fmt.Errorf("first key %v, want %q", t, ProvenanceKey)
	}
	var p Provenance
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("%s: %w", ProvenanceKey, err)
	}
	switch {
	case p.Commit == "":
		return fmt.Errorf("%s: no commit", ProvenanceKey)
	case p.Cores <= 0:
		return fmt.Errorf("%s: no cores", ProvenanceKey)
	case p.Machine == "":
		return fmt.Errorf("%s: no machine", ProvenanceKey)
	case p.Load1 == nil && p.Note == "":
		return fmt.Errorf("%s: no load and no note saying why", ProvenanceKey)
	}
	if _, err := time.Parse(time.RFC3339, p.UTC); err != nil {
		return fmt.Errorf("%s: utc: %w", ProvenanceKey, err)
	}
	return nil
}
