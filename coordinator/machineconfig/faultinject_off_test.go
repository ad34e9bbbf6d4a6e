//go:build !cutover_faultinject

package machineconfig

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// The default build compiles no driver that skips the drain
// (faultinject_off.go), so the drain guard's bite test runs here through a
// build of this package with one (faultinject_test.go). kubetest.Require
// first: without a kube-apiserver the tagged build would only skip too.
func TestDrainGuardBites(t *testing.T) {
	kubetest.Require(t)
	testenv.RunFaultInjected(t, "TestDrainGuardBites")
}
