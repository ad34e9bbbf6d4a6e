//go:build !cutover_faultinject

package coordinator

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// The runner's bite tests (faultinject_test.go) run in a build with the
// tag cutover_faultinject; plain go test runs them through it.
func TestCommitNotSentUnjournaledBites(t *testing.T) {
	testenv.RunFaultInjected(t, "TestCommitNotSentUnjournaledBites")
}
