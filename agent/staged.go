package agent

import (
	"context"
	"fmt"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkStrategy validates a request's strategy field: true for staged.
func checkStrategy(s string) (bool, error) {
	switch s {
	case "", operation.StrategyAtomic:
		return false, nil
	case operation.StrategyStaged:
		return true, nil
	}
	return false, status.Errorf(codes.InvalidArgument, "strategy %q: must be %q or %q", s, operation.StrategyAtomic, operation.StrategyStaged)
}

// stagedCheck turns an atomic preflight into the staged one: the same
// port checks, the backend's staged problems, and the staged actions in
// place of the flip's.
func stagedCheck(ctx context.Context, be dataplane.Backend, c *dataplane.Check, to tunnelport.Port) {
	st, ok := be.(dataplane.Stager)
	if !ok {
		c.Problems = append(c.Problems, fmt.Sprintf("backend %s does not support the staged strategy: use --strategy atomic", be.Name()))
		return
	}
	c.Problems = append(c.Problems, st.StagedProblems(ctx, to)...)
	c.Actions = st.StagedActions(c.CurrentPort, to)
}
