package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newCutoverCmd(g *Globals) *cobra.Command {
	var (
		t      targetFlags
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "cutover --port N [--strategy atomic|staged|auto] [--dry-run] [--nodes a,b | --selector k=v] [--timeout 30s] [--allow-nodeport-range] [--allow-tunnel-port]",
		Short: "Move the overlay to a new VXLAN port on every node, verified and reversible",
		Long: `Run a cutover: preflight, prepare (open the new port everywhere), commit (all
nodes flip at one instant), verify (read-back and probe mesh), confirm and
finalize. On a failure before commit every node is put back as it was
(ABORTED); after commit, on a failed verification, every node reverts to the
old port (ROLLED_BACK).

Progress is shown live: operation-wide events and every failure as lines,
each step closed by a line with how many nodes answered and the slowest;
on a terminal a live line shows the step in flight (done/total, who is
still awaited). The final report gives per-phase durations,
the commit spread, per-node results and the probe disruption. With -o json
only the final report is printed, as JSON.

--strategy staged (docs/staged.md): every node first listens on both ports,
the senders switch in --batches with the probe mesh verified after each, then
the old port is retired; no commit instant. With --nodes/--selector only
those nodes switch and the operation is HELD (every node listening on both)
until a later staged cutover to the same port switches more (without
--nodes/--selector: the rest, then the retirement) or coordctl rollback
undoes it all; nothing else runs meanwhile.

--strategy auto: staged where every node accepts it and its agent says staged
loses less there (kernel VXLAN; OVS with --ovs-standing-redirects), else
atomic; the report says which ran and why. Not with --batches,
--max-parallel, --nodes or --selector.

Without --strategy the coordinator's --default-strategy decides: auto (its
default) over the whole overlay; with --nodes/--selector, atomic. Name
--strategy atomic for one commit instant whatever the overlay.

--timeout is the per-step deadline on the agents (default: the
coordinator's); coordctl waits up to 10x --timeout for the whole operation,
after which it stops waiting but the operation continues (coordctl status).
--dry-run runs preflight only and changes nothing.

Exit codes: 0 SUCCEEDED or HELD; 7 SUCCEEDED with warnings (a late node: see the
report's "warnings:"); 1 ABORTED or ROLLED_BACK (every node is on one port,
the old one); 5 FAILED (operator needed); 4 preflight problems (also a dry
run that found problems); 6 stream ended without a final report; 2 bad
input; 3 coordinator unreachable. See coordctl help exit-codes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := t.request()
			if err != nil {
				return err
			}
			req.DryRun = dryRun
			if g.timeoutSet {
				req.TimeoutMillis = g.Timeout.Milliseconds()
			}
			client, closer, err := g.Dial()
			if err != nil {
				return err
			}
			defer func() { _ = closer.Close() }()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*g.Timeout)
			defer cancel()
			stream, err := client.Cutover(ctx, req)
			if err != nil {
				return rpcError(g, "cutover", err, true)
			}
			outcome := outcomeCutover
			if dryRun {
				outcome = outcomeDryRun
			}
			return follow(g, "cutover", stream.Recv, outcome)
		},
	}
	t.add(cmd)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "preflight only: change nothing")
	return cmd
}

type outcome int

const (
	outcomeCutover  outcome = iota // success is SUCCEEDED
	outcomeDryRun                  // success is SUCCEEDED; anything else means problems
	outcomeRollback                // success is ROLLED_BACK (or ABORTED: nothing had flipped)
)

// follow renders an operation stream and turns its final report into the
// exit code.
func follow(g *Globals, what string, recv func() (*coordinatorv1.OperationEvent, error), o outcome) error {
	var prog *progress
	if !g.JSON() {
		prog = newProgress(g.Stdout, isTerminal(g.Stdout))
		// A stream that ends without a report leaves no live line behind.
		defer prog.clearLive()
	}
	got := 0
	for {
		ev, err := recv()
		if errors.Is(err, io.EOF) {
			return Exitf(ExitInterrupted, "%s: the coordinator ended the stream without a final report; the operation may still be running: see coordctl status", what)
		}
		if err != nil && got > 0 && status.Code(err) == codes.Unavailable {
			// The operation had started: the coordinator went away (crash,
			// restart) mid-run. That is not "unreachable" (exit 3): a
			// restarted coordinator resumes or undoes the operation from
			// its journal, so say where to look.
			return Exitf(ExitInterrupted, "%s: lost the coordinator during the operation (%s); it resumes or undoes the operation from its journal when it runs again: see coordctl status",
				what, status.Convert(err).Message())
		}
		if err != nil {
			return rpcError(g, what, err, true)
		}
		got++
		if prog != nil {
			prog.event(ev)
		}
		if rep := ev.GetReport(); rep != nil {
			if prog != nil {
				prog.finish()
				_, _ = io.WriteString(g.Stdout, "\n")
			}
			if err := printReport(g, rep); err != nil {
				return err
			}
			return reportExit(rep, o)
		}
	}
}

func printReport(g *Globals, rep *coordinatorv1.Report) error {
	if g.JSON() {
		return writeJSON(g.Stdout, rep)
	}
	renderReport(g.Stdout, rep)
	return nil
}

// reportExit maps an operation's final state to the exit code.
func reportExit(rep *coordinatorv1.Report, o outcome) error {
	st := rep.GetState()
	detail := ""
	if rep.GetError() != "" {
		detail = ": " + rep.GetError()
	}
	id := orDash(rep.GetOperationId())
	if o == outcomeDryRun && st == coordinatorv1.OperationState_OPERATION_STATE_UNSPECIFIED && rep.GetError() == "" {
		// A dry run that passed preflight reports no state: nothing ran.
		return nil
	}
	if rep.GetKind() == "rollback" && o == outcomeRollback {
		// A reverse cutover undoes an operation that had succeeded: it
		// worked when it succeeds; if it aborted or rolled back, the nodes
		// stayed on the port the original operation moved them to.
		switch st {
		case coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED:
			return nil
		case coordinatorv1.OperationState_OPERATION_STATE_FAILED:
			return Exitf(ExitOpFailed, "rollback of %s (reverse cutover %s) FAILED: operator needed%s", rep.GetRevertsOperationId(), id, detail)
		default:
			return Exitf(ExitFailed, "rollback of %s (reverse cutover %s) ended %s: every node stayed on port %d%s",
				rep.GetRevertsOperationId(), id, strings.TrimPrefix(st.String(), "OPERATION_STATE_"), rep.GetFromPort(), detail)
		}
	}
	switch st {
	case coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED:
		if o == outcomeRollback {
			return Exitf(ExitFailed, "operation %s is SUCCEEDED: nothing was rolled back%s", id, detail)
		}
		if w := rep.GetWarnings(); len(w) > 0 {
			return warningsExit(id, w)
		}
		return nil
	case coordinatorv1.OperationState_OPERATION_STATE_ABORTED, coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK:
		switch o {
		case outcomeRollback:
			return nil
		case outcomeDryRun:
			return Exitf(ExitProblems, "dry run %s: %s%s; nothing was changed", id, stateName(st), detail)
		}
		return Exitf(ExitFailed, "operation %s %s: every node is back on port %d%s", id, stateName(st), rep.GetFromPort(), detail)
	case coordinatorv1.OperationState_OPERATION_STATE_HELD:
		// The subset asked for switched; the rest listen on both ports
		// until a later run (the report says who is where).
		if o == outcomeRollback {
			return Exitf(ExitFailed, "operation %s is HELD: nothing was rolled back%s", id, detail)
		}
		if w := rep.GetWarnings(); len(w) > 0 {
			return warningsExit(id, w)
		}
		return nil
	case coordinatorv1.OperationState_OPERATION_STATE_FAILED:
		return Exitf(ExitOpFailed, "operation %s FAILED: the cluster may be split between ports; an operator is needed (coordctl status %s, coordctl rollback %s)%s", id, id, id, detail)
	}
	return Exitf(ExitInterrupted, "operation %s: final report in state %s; see coordctl status %s", id, stateName(st), id)
}

// isTerminal reports whether w is a terminal. It is what golang.org/x/term
// IsTerminal does on Linux and macOS (ioctlReadTermios, per OS); calling
// x/sys directly avoids adding a module to
// go.mod, which other engineers edit concurrently.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlReadTermios)
	return err == nil
}

func withTimeout(cmd *cobra.Command, g *Globals) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), g.Timeout)
}
