package cli

import (
	"context"

	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newPlanCmd(g *Globals) *cobra.Command {
	var t targetFlags
	cmd := &cobra.Command{
		Use:   "plan --port N [--strategy atomic|staged|auto] [--nodes a,b | --selector k=v] [--allow-nodeport-range] [--allow-tunnel-port]",
		Short: "Preflight a port change: what would happen on each node, and the problems. Changes nothing",
		Long: `Run preflight for moving the overlay to --port and show, per node, the port in
use now, whether the new port is free, which list of actions it would run,
and its problems; then each distinct list of actions once, with the nodes it
applies to, and every problem found. -o wide adds every node's actions in
full; -o json gives the plan as the coordinator sent it. Nothing is changed
on any node.

Exit codes: 0 no problems (the cutover may go), 4 problems found, 2 bad
input, 3 coordinator unreachable. See coordctl help exit-codes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, resp, err := checkCall(cmd, g, &t, "plan", func(ctx context.Context, c coordinatorv1.CoordinatorServiceClient, req *coordinatorv1.CutoverRequest) (*coordinatorv1.PlanResponse, error) {
				return c.Plan(ctx, req)
			})
			if err != nil {
				return err
			}
			if g.JSON() {
				if err := writeJSON(g.Stdout, resp); err != nil {
					return err
				}
			} else {
				renderPlan(g.Stdout, resp, g.Output == "wide")
			}
			if n := planProblems(resp); n > 0 {
				return Exitf(ExitProblems, "plan for port %d: %d problem(s); nothing was changed", req.GetPort(), n)
			}
			return nil
		},
	}
	t.add(cmd)
	return cmd
}
