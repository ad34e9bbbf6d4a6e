package cli

import "strings"

// warningsExit is ExitWarnings for an operation that SUCCEEDED but is
// flagged (Report.warnings: nodes left out of the probe mesh, pairs dark
// before the change, mesh verification off, a late node under the wait
// policy): not a clean success (I7), so not 0.
func warningsExit(id string, warnings []string) error {
	return Exitf(ExitWarnings, "operation %s SUCCEEDED with %d warning(s): %s", id, len(warnings), strings.Join(warnings, "; "))
}
