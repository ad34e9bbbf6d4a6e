package cli

import (
	"context"

	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newRollbackCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback [OP]",
		Short: "Put every node of an operation back on its prior port (the current or last operation when OP is omitted)",
		Long: `Roll an operation back: every node returns to the port it had before the
operation (a prepared node drops the new port's firewall opening, a
committed one reverts). An operation that already SUCCEEDED (its nodes are
finalized and the old port's firewall rules are gone) is rolled back by a
reverse cutover: the old port is reopened on every node first, then every
node flips at one instant, verified like any cutover. Progress is streamed
like cutover.

Exit codes: 0 ROLLED_BACK or ABORTED, or the reverse cutover SUCCEEDED
(every node on the prior port);
1 the operation is SUCCEEDED and was not rolled back; 5 FAILED (operator
needed); 6 stream ended without a final report; 2 bad or unknown OP,
4 the coordinator refused (e.g. nothing to roll back); 3 coordinator
unreachable. See coordctl help exit-codes.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := optionalOpID(args)
			if err != nil {
				return err
			}
			client, closer, err := g.Dial()
			if err != nil {
				return err
			}
			defer func() { _ = closer.Close() }()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*g.Timeout)
			defer cancel()
			stream, err := client.Rollback(ctx, &coordinatorv1.RollbackRequest{OperationId: id})
			if err != nil {
				return rpcError(g, "rollback", err, true)
			}
			return follow(g, "rollback", stream.Recv, outcomeRollback)
		},
	}
}
