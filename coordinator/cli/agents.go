package cli

import (
	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newAgentsCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "agents",
		Short: "List the agents the coordinator knows, with readiness, port and clock offset",
		Long: `List every agent the coordinator knows: node, address, version, dataplane
backend and device, the VXLAN port read back from the dataplane, readiness
(or what is not ready), clock offset to the coordinator and round trip, in
milliseconds.

Exit codes: 0 listed (even when some agents are not ready), 3 coordinator
unreachable. See coordctl help exit-codes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, closer, err := g.Dial()
			if err != nil {
				return err
			}
			defer func() { _ = closer.Close() }()
			ctx, cancel := withTimeout(cmd, g)
			defer cancel()
			resp, err := client.ListAgents(ctx, &coordinatorv1.ListAgentsRequest{})
			if err != nil {
				return rpcError(g, "agents", err, false)
			}
			if g.JSON() {
				return writeJSON(g.Stdout, resp)
			}
			renderAgents(g.Stdout, resp.GetAgents())
			return nil
		},
	}
}
