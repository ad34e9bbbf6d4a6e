// Package labtest is test support for the lab's test packages (harness/lab
// and harness/lab/faults): it builds the real binaries a lab runs from this
// tree.
// It is imported by tests only and must not be by the agent or coordinator.
package labtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// EnvBin names a directory of prebuilt lab binaries (Binaries).
const EnvBin = "COT_LAB_BIN"

// BuildTools is what Binaries needs on PATH: go, unless EnvBin names
// prebuilt binaries.
func BuildTools() []string {
	if os.Getenv(EnvBin) != "" {
		return nil
	}
	return []string{"go"}
}

var (
	once sync.Once
	dir  string
	err  error
)

// Binaries builds agent, coordinator, coordctl and cutover-lab from this
// tree once per test binary (the tests that need them share it), so no test
// runs stale binaries from bin/, and returns their directory. Call Cleanup from
// TestMain after m.Run to remove it.
//
// With COT_LAB_BIN set (EnvBin) it builds nothing and returns that
// directory, which must hold the agent, coordinator and coordctl: a
// machine without Go runs a bundle's prebuilt binaries
// (hack/manycore-bundle.sh; no cutover-lab, which its benchmarks do not
// run).
func Binaries(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvBin); d != "" {
		for _, name := range []string{"agent", "coordinator", "coordctl"} {
			if _, err := os.Stat(filepath.Join(d, name)); err != nil {
				t.Fatalf("%s=%s: %v", EnvBin, d, err)
			}
		}
		return d
	}
	testenv.RequireBinaries(t, "go")
	once.Do(func() {
		dir, err = os.MkdirTemp("", "cot-lab-bin-")
		if err != nil {
			return
		}
		// Import paths, not ./dirs: they resolve from any package of the module.
		const m = "github.com/cutover-dev/cutover"
		cmd := exec.Command("go", "build", "-o", dir+"/", m+"/agent/cmd/agent", m+"/coordinator/cmd/coordinator", m+"/coordinator/cmd/coordctl", m+"/harness/cmd/cutover-lab")
		if out, buildErr := cmd.CombinedOutput(); buildErr != nil {
			err = fmt.Errorf("go build: %w\n%s", buildErr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

var (
	fiOnce sync.Once
	fiDir  string
	fiErr  error
)

// FaultInjectTag is the build tag that compiles the agent's test-only
// mutations (agent/faultinject.go: the agent named by
// agent.FaultInjectEnv flips at Prepare, and the others beside it): the
// one tag of every bite test (testenv.FaultInjectTag). The shipped build
// never sets it (conventions_test.go checks).
const FaultInjectTag = testenv.FaultInjectTag

// FaultInjectAgent builds the agent with FaultInjectTag once per test
// binary and returns its path: only the tests that prove the suite's I2
// check bites run it.
func FaultInjectAgent(t testing.TB) string {
	t.Helper()
	testenv.RequireBinaries(t, "go")
	fiOnce.Do(func() {
		fiDir, fiErr = os.MkdirTemp("", "cot-lab-fi-")
		if fiErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-tags", FaultInjectTag, "-o", fiDir+"/agent", "github.com/cutover-dev/cutover/agent/cmd/agent")
		if out, buildErr := cmd.CombinedOutput(); buildErr != nil {
			fiErr = fmt.Errorf("go build -tags %s: %w\n%s", FaultInjectTag, buildErr, out)
		}
	})
	if fiErr != nil {
		t.Fatal(fiErr)
	}
	return fiDir + "/agent"
}

// AgentAt builds the agent of this repository at rev (a commit) into a
// directory of its own and returns its path: a benchmark measures the
// code before a change beside the tree's, on the same machine in the same
// run. The source is a git archive of rev, so no worktree is registered.
func AgentAt(t testing.TB, rev string) string {
	t.Helper()
	testenv.RequireBinaries(t, "go", "git", "tar")
	d, err := os.MkdirTemp("", "cot-lab-base-")
	if err != nil {
		t.Fatal(err)
	}
	atMu.Lock()
	atDirs = append(atDirs, d)
	atMu.Unlock()
	src := d + "/src"
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$(git rev-parse --show-toplevel)" archive --format=tar "$1" | tar -x -C "$2"`, "sh", rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s (set the revision to one of this repository)", rev, err, out)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", d+"/agent", "./agent/cmd/agent")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the agent at %s: %v\n%s", rev, err, out)
	}
	return d + "/agent"
}

var (
	atMu   sync.Mutex
	atDirs []string
)

// Cleanup removes what Binaries, FaultInjectAgent and AgentAt built.
func Cleanup() {
	atMu.Lock()
	defer atMu.Unlock()
	for _, d := range append([]string{dir, fiDir}, atDirs...) {
		if d != "" {
			_ = os.RemoveAll(d)
		}
	}
}
