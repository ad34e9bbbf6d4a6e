package testenv

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// FaultInjectTag is the build tag that compiles the test-only mutations
// the bite tests set (agent/faultinject.go, coordinator/internal/barrier
// and coordinator/machineconfig faultinject.go): a safety check shown to
// fail when the rule it guards is broken. No shipped build sets it
// (conventions_test.go checks).
const FaultInjectTag = "cutover_faultinject"

// RunFaultInjected runs test, a top-level test of the package under test,
// in a build of that package with FaultInjectTag, and passes, skips or
// fails as it did. The default build declares test as a call of this, so
// that plain go test (make test, CI) runs every bite test while no
// default build, the package's tests included, compiles a mutation.
func RunFaultInjected(t *testing.T, test string) {
	t.Helper()
	RequireBinaries(t, "go")
	args := []string{"test", "-tags", FaultInjectTag, "-count=1", "-v", "-run", "^" + test + "$"}
	if testing.Short() {
		args = append(args, "-short")
	}
	// A test runs in its package's directory: "." is the package under test.
	args = append(args, ".")
	cmd := "go " + strings.Join(args, " ")
	out, err := exec.Command("go", args...).CombinedOutput()
	switch {
	case err == nil && bytes.Contains(out, []byte("--- PASS: "+test+" (")):
		t.Logf("%s: passed", cmd)
	case err == nil && bytes.Contains(out, []byte("--- SKIP: "+test+" (")):
		t.Skipf("%s: skipped:\n%s", cmd, out)
	default:
		// No PASS line is a failure too: a test that was renamed or
		// lost its tag would otherwise pass here without running.
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}
