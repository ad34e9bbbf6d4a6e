package cli

import "github.com/spf13/cobra"

const exitCodesHelp = `Exit codes:
  0  success (cutover SUCCEEDED, or HELD: a staged subset switched; plan
     without problems; rollback done)
  1  the operation was ABORTED or ROLLED_BACK: every node is on one port, the
     old one; or another error
  2  bad input: a flag, an argument, or a request the coordinator refused as
     invalid. Nothing was sent (client-side checks) or nothing changed
  3  coordinator unreachable, TLS/mTLS failure, or not authorised
  4  plan/preflight found problems (also: cutover refused for a failed
     precondition, dry run with problems); nothing was changed
  5  the operation ended FAILED: nodes may disagree, an operator is needed
  6  the stream ended before a final report (coordinator gone, wait limit,
     Ctrl-C): the operation may still be running, see coordctl status
  7  the operation SUCCEEDED with warnings (the report's "warnings:"): every
     node is on the new port, but it was not a clean success: not verified
     everywhere (nodes without probing, pairs dark before the change), or a
     node applied the commit later than --commit-late-budget under
     --commit-late-policy=wait, or the commit spread exceeded
     --commit-spread-target (the nodes did not flip together), so the
     overlay was split meanwhile

coordctl machineconfig uses the same numbers for its own outcomes: see
coordctl machineconfig --help.`

// newExitCodesTopic is `coordctl help exit-codes`: a command without Run is
// an additional help topic in cobra.
func newExitCodesTopic() *cobra.Command {
	return &cobra.Command{
		Use:   "exit-codes",
		Short: "What coordctl's exit codes mean",
		Long:  exitCodesHelp,
	}
}
