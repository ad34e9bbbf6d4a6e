package cli

import (
	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newStatusCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status [OP]",
		Short: "Report an operation (the current or last one when OP is omitted)",
		Long: `Report an operation: its state, ports, phase durations, commit spread,
per-node result and the probe disruption measured. Without OP, the current
or last operation.

Exit codes follow the operation's state, so scripts can wait on it:
0 SUCCEEDED or still RUNNING, 1 ABORTED or ROLLED_BACK, 5 FAILED (operator
needed), 2 bad or unknown OP, 3 coordinator unreachable. See coordctl help
exit-codes.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := fetchReport(cmd, g, args, "status")
			if err != nil {
				return err
			}
			if err := printReport(g, rep); err != nil {
				return err
			}
			if rep.GetState() == coordinatorv1.OperationState_OPERATION_STATE_RUNNING {
				return nil
			}
			return reportExit(rep, outcomeCutover)
		},
	}
}
