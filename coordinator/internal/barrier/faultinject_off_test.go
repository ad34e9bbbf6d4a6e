//go:build !cutover_faultinject

package barrier

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// The default build compiles none of the bite tests' switches
// (faultinject_off.go), so each bite test runs here through a build of
// this package with them (faultinject_test.go).

func TestStagedInvariantBites(t *testing.T) { testenv.RunFaultInjected(t, "TestStagedInvariantBites") }

func TestStagedSubsetBites(t *testing.T) { testenv.RunFaultInjected(t, "TestStagedSubsetBites") }
