package cli

import (
	"context"

	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// checkCall runs one read-only check built from the target flags (plan,
// pathcheck): the request, the connection, the command's timeout (also
// sent to the coordinator when given), and the call, whose error is named
// after verb.
func checkCall[T any](cmd *cobra.Command, g *Globals, t *targetFlags, verb string,
	call func(context.Context, coordinatorv1.CoordinatorServiceClient, *coordinatorv1.CutoverRequest) (T, error),
) (*coordinatorv1.CutoverRequest, T, error) {
	var zero T
	req, err := t.request()
	if err != nil {
		return nil, zero, err
	}
	client, closer, err := g.Dial()
	if err != nil {
		return nil, zero, err
	}
	defer func() { _ = closer.Close() }()
	ctx, cancel := withTimeout(cmd, g)
	defer cancel()
	if g.timeoutSet {
		req.TimeoutMillis = g.Timeout.Milliseconds()
	}
	res, err := call(ctx, client, req)
	if err != nil {
		return req, zero, rpcError(g, verb, err, false)
	}
	return req, res, nil
}

// fetchReport asks for the report of the operation named in args, or of
// the current or last one; its error is named after verb.
func fetchReport(cmd *cobra.Command, g *Globals, args []string, verb string) (*coordinatorv1.Report, error) {
	id, err := optionalOpID(args)
	if err != nil {
		return nil, err
	}
	client, closer, err := g.Dial()
	if err != nil {
		return nil, err
	}
	defer func() { _ = closer.Close() }()
	ctx, cancel := withTimeout(cmd, g)
	defer cancel()
	rep, err := client.Status(ctx, &coordinatorv1.StatusRequest{OperationId: id})
	if err != nil {
		return nil, rpcError(g, verb, err, false)
	}
	return rep, nil
}
