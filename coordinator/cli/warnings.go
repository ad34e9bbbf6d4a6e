package cli

import "strings"

// ExitWarnings is a cutover that SUCCEEDED but is flagged (Report.warnings:
// nodes left out of the probe mesh, pairs dark before the change, mesh
// verification off): not a clean success (I7), so not 0.
const ExitWarnings = 7

func warningsExit(id string, warnings []string) error {
	return Exitf(ExitWarnings, "operation %s SUCCEEDED with warnings (not verified everywhere):\n  %s", id, strings.Join(warnings, "\n  "))
}
