//go:build !cutover_faultinject

package probe

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// The mesh's bite test (riding_faultinject_test.go) runs in a build with
// the tag cutover_faultinject; plain go test runs it through it.
func TestRidingAnswersSpareOlderAgentsBites(t *testing.T) {
	testenv.RunFaultInjected(t, "TestRidingAnswersSpareOlderAgentsBites")
}
