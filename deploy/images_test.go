package deploy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/image"
)

// No image can be built here (no container engine), so the Dockerfiles are
// checked as text against the tree and the Makefile: what they copy exists,
// what they build exists and is all they copy, they build the way `make
// build` does, and the entrypoint is the binary they built.

type instruction struct {
	line int
	cmd  string // upper case: FROM, COPY, RUN, ...
	args string
}

type stage struct {
	base, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// continuation lines and dropping comments.
func parseDockerfile(text string) ([]stage, error) {
	var stages []stage
	sc := bufio.NewScanner(strings.NewReader(text))
	n, start := 0, 0
	var cur strings.Builder
	flush := func() error {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 && in.cmd != "ARG" {
			return fmt.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
		}
		if len(stages) > 0 {
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
		return nil
	}
	for sc.Scan() {
		n++
		l := sc.Text()
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "#") || (t == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		cur.WriteString(l)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return stages, flush()
}

// makeLDFlags is the Makefile's LDFLAGS with $(VERSION) as ${VERSION}.
func makeLDFlags(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Makefile defines no LDFLAGS")
	}
	return strings.ReplaceAll(strings.TrimSpace(string(m[1])), "$(VERSION)", "${VERSION}")
}

// goBuild is a `go build` found in a RUN instruction.
type goBuild struct {
	env, flags, ldflags, out string
	pkgs                     []string
}

var goBuildRE = regexp.MustCompile(`((?:[A-Z_]+=\S+\s+)*)go build\s+(.*)$`)

func parseGoBuild(run string) (*goBuild, bool) {
	// Drop BuildKit --mount options of RUN itself.
	for strings.HasPrefix(run, "--") {
		_, run, _ = strings.Cut(run, " ")
		run = strings.TrimSpace(run)
	}
	m := goBuildRE.FindStringSubmatch(run)
	if m == nil {
		return nil, false
	}
	g := &goBuild{env: m[1]}
	rest := m[2]
	if i := strings.Index(rest, `-ldflags "`); i >= 0 {
		j := strings.Index(rest[i+10:], `"`)
		g.ldflags = rest[i+10 : i+10+j]
		rest = rest[:i] + rest[i+10+j+1:]
	}
	f := strings.Fields(rest)
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "-o" && i+1 < len(f):
			g.out = f[i+1]
			i++
		case strings.HasPrefix(f[i], "-"):
			g.flags += f[i] + " "
		default:
			g.pkgs = append(g.pkgs, f[i])
		}
	}
	return g, true
}

// dockerfileProblems checks one Dockerfile; wantBinaries are the commands
// it must build and the first is its entrypoint.
func dockerfileProblems(t *testing.T, path string, wantBinaries []string, nonroot bool) []string {
	t.Helper()
	name := filepath.Base(path)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := parseDockerfile(string(text))
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	badf := func(f string, a ...any) { bad = append(bad, fmt.Sprintf(name+": "+f, a...)) }
	if len(stages) < 2 {
		return []string{name + ": want a multi-stage build (builder + runtime)"}
	}
	for _, s := range stages {
		if !strings.Contains(s.base, ":") || strings.HasSuffix(s.base, ":latest") {
			badf("base image %s: pin a tag", s.base)
		}
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.HasPrefix(build.base, "golang:") {
		badf("first stage %s: want a golang builder", build.base)
	}
	ldflags := makeLDFlags(t)
	var copied []string
	built := map[string]bool{} // paths the builder writes
	var g *goBuild
	for _, in := range build.ins {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				if _, err := os.Stat(filepath.Join("..", src)); err != nil {
					badf("line %d: COPY %s: not in the repository", in.line, src)
				}
				if pat := dockerIgnored(t, src); pat != "" {
					badf("line %d: COPY %s: excluded from the build context by .dockerignore (%s)", in.line, src, pat)
				}
				copied = append(copied, strings.TrimSuffix(src, "/"))
			}
		case "RUN":
			if gb, ok := parseGoBuild(in.args); ok {
				g = gb
			}
		}
	}
	if g == nil {
		return append(bad, name+": the builder runs no go build")
	}
	if !strings.Contains(g.env, "CGO_ENABLED=0") {
		badf("go build without CGO_ENABLED=0: the binary would not be static")
	}
	if !strings.Contains(g.flags, "-trimpath") {
		badf("go build without -trimpath (make build uses it)")
	}
	if g.ldflags != ldflags {
		badf("go build -ldflags %q, Makefile's LDFLAGS are %q", g.ldflags, ldflags)
	}
	for _, want := range wantBinaries {
		pkg := "./" + want
		if !slices.Contains(g.pkgs, pkg) {
			badf("go build does not build %s (builds %v)", pkg, g.pkgs)
		}
		bin := filepath.Base(want)
		if strings.HasSuffix(g.out, "/") {
			built[g.out+bin] = true
		} else if len(g.pkgs) == 1 {
			built[g.out] = true
		}
	}
	for _, pkg := range g.pkgs {
		if _, err := os.Stat(filepath.Join("..", pkg, "main.go")); err != nil {
			badf("go build %s: no main.go there", pkg)
		}
		// Every package of this module the binary links must be copied in.
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			rel, ok := strings.CutPrefix(dep, "github.com/cutover-dev/cutover/")
			if !ok {
				continue
			}
			if !slices.ContainsFunc(copied, func(c string) bool { return rel == c || strings.HasPrefix(rel, c+"/") }) {
				badf("%s links %s, which no COPY brings into the builder", pkg, rel)
			}
		}
	}
	// The runtime stage copies the built binaries and runs the first.
	dests := map[string]string{}
	var entry []string
	user := ""
	for _, in := range final.ins {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				if !built[f[1]] {
					badf("line %d: COPY %s: the builder does not write it (it writes %v)", in.line, f[1], built)
				}
				dests[filepath.Base(f[1])] = f[2]
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entry); err != nil {
				badf("line %d: ENTRYPOINT must be exec form (a JSON array): %v", in.line, err)
			}
		case "USER":
			user = in.args
		}
	}
	for _, want := range wantBinaries {
		if dests[filepath.Base(want)] == "" {
			badf("runtime stage does not copy %s from the builder", filepath.Base(want))
		}
	}
	if len(entry) == 0 || entry[0] != dests[filepath.Base(wantBinaries[0])] {
		badf("ENTRYPOINT %v, want the %s binary copied to %q", entry, filepath.Base(wantBinaries[0]), dests[filepath.Base(wantBinaries[0])])
	}
	if nonroot {
		uid, _, _ := strings.Cut(user, ":")
		if uid == "" || uid == "0" || uid == "root" || !regexp.MustCompile(`^[0-9]+$`).MatchString(uid) {
			badf("USER %q: want a numeric non-root user (runAsNonRoot can only verify a number)", user)
		}
	}
	return bad
}

func TestDockerfiles(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not in PATH")
	}
	for _, p := range dockerfileProblems(t, "../Dockerfile.agent", []string{"agent/cmd/agent"}, false) {
		t.Error(p)
	}
	for _, p := range dockerfileProblems(t, "../Dockerfile.coordinator", []string{"coordinator/cmd/coordinator", "coordinator/cmd/coordctl"}, true) {
		t.Error(p)
	}
	b, _ := os.ReadFile("../Dockerfile.agent")
	for _, p := range agentPackageProblems(t, string(b)) {
		t.Error(p)
	}
}

// agentPackageProblems holds Dockerfile.agent's apt-get install to the
// package set `make images` assembles the agent image from: the
// Makefile's AGENT_PACKAGES, which is harness/image.AgentPackages (the
// tools the agent execs come from these: iptables, nftables,
// openvswitch-common, openvswitch-switch, iproute2).
func agentPackageProblems(t *testing.T, dockerfile string) []string {
	t.Helper()
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^AGENT_PACKAGES\s*:?=\s*(.+)$`).FindSubmatch(mk)
	if m == nil {
		return []string{"Makefile defines no AGENT_PACKAGES"}
	}
	makePkgs := slices.Sorted(slices.Values(strings.Fields(string(m[1]))))
	var bad []string
	if want := slices.Sorted(slices.Values(image.AgentPackages)); !slices.Equal(makePkgs, want) {
		bad = append(bad, fmt.Sprintf("Makefile AGENT_PACKAGES %v, harness/image.AgentPackages %v", makePkgs, want))
	}
	d := regexp.MustCompile(`apt-get install((?:\s+-\S+)*)((?:\s+[a-z0-9][a-z0-9.+-]*)+)`).FindStringSubmatch(strings.ReplaceAll(dockerfile, "\\\n", " "))
	if d == nil {
		return append(bad, "Dockerfile.agent: no apt-get install in the runtime stage")
	}
	dockerPkgs := slices.Sorted(slices.Values(strings.Fields(d[2])))
	if !slices.Equal(dockerPkgs, makePkgs) {
		bad = append(bad, fmt.Sprintf("Dockerfile.agent installs %v, the Makefile's AGENT_PACKAGES (what make images assembles the agent image from) are %v", dockerPkgs, makePkgs))
	}
	return bad
}

func TestAgentPackageCheckFailsOnADifferentSet(t *testing.T) {
	got := strings.Join(agentPackageProblems(t, "FROM debian:bookworm-slim\nRUN apt-get install -y --no-install-recommends iptables nftables \\\n && true\n"), "\n")
	if !strings.Contains(got, "Dockerfile.agent installs [iptables nftables], the Makefile's AGENT_PACKAGES") {
		t.Errorf("a Dockerfile without the OVS tools passed: %q", got)
	}
}

// The checks fail on a broken Dockerfile.
func TestDockerfileCheckFailsOnBrokenFile(t *testing.T) {
	dir := t.TempDir()
	broken := `FROM golang:1.26 AS build
COPY agent/ agent/
COPY nonexistent/ nonexistent/
RUN go build -o /out/agent ./agent/cmd/agent
FROM debian:latest
COPY --from=build /out/agnet /agent
ENTRYPOINT /agent
`
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile.broken"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(dockerfileProblems(t, filepath.Join(dir, "Dockerfile.broken"), []string{"agent/cmd/agent"}, true), "\n")
	for _, want := range []string{
		"COPY nonexistent/: not in the repository", "CGO_ENABLED=0", "-trimpath", "-ldflags",
		"links pkg/", "/out/agnet: the builder does not write it", "ENTRYPOINT must be exec form",
		"debian:latest: pin a tag", "USER",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("check did not report %q; it reported:\n%s", want, got)
		}
	}
}

// dockerIgnored returns the ../.dockerignore pattern that keeps src out of
// the build context, or "". Only the plain path patterns the file uses are
// understood (a name, a directory, or **/name for any depth).
func dockerIgnored(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	return ignoredBy(string(b), src)
}

func ignoredBy(ignore, src string) string {
	src = strings.Trim(filepath.Clean(src), "/")
	for _, line := range strings.Split(ignore, "\n") {
		pat := strings.TrimSpace(line)
		if pat == "" || strings.HasPrefix(pat, "#") {
			continue
		}
		p := strings.Trim(pat, "/")
		if name, ok := strings.CutPrefix(p, "**/"); ok {
			for _, part := range strings.Split(src, "/") {
				if part == name {
					return pat
				}
			}
			continue
		}
		if src == p || strings.HasPrefix(src, p+"/") {
			return pat
		}
	}
	return ""
}

func TestIgnoredBy(t *testing.T) {
	ignore := "# c\n.git\ndeploy/\n**/testdata\n"
	for src, want := range map[string]string{
		"deploy/base": "deploy/", "deploy": "deploy/", "agent/": "", "pkg/lab/testdata/x": "**/testdata",
		"deployx": "", "go.mod": "",
	} {
		if got := ignoredBy(ignore, src); got != want {
			t.Errorf("ignoredBy(%q) = %q, want %q", src, got, want)
		}
	}
}
