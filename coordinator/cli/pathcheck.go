package cli

import (
	"context"

	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

func newPathCheckCmd(g *Globals) *cobra.Command {
	var t targetFlags
	cmd := &cobra.Command{
		Use:   "pathcheck --port N [--nodes a,b | --selector k=v]",
		Short: "Check that the underlay passes real VXLAN frames on a port between the nodes. Changes nothing",
		Long: `Have every agent bind --port on its node's underlay address for a moment and
exchange real VXLAN frames (the overlay's VNIs, and a VNI the overlay does not
use; sizes up to the overlay MTU + 50 with don't-fragment set) with the other
nodes, both ways, then show the matrix: blocked pairs, VNI-specific drops and
MTU black holes, each naming the nodes. Every pair up to a size, then a sample
in which every node is sender and receiver (the output says which). Plan and
cutover run the same check in their preflight. Nothing is changed: no OVS, no
tunnel device, no firewall rule; the sockets are closed when the check ends.

Exit codes: 0 the path passes, 4 problems found, 2 bad input, 3 coordinator
unreachable. See coordctl help exit-codes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, res, err := checkCall(cmd, g, &t, "pathcheck", func(ctx context.Context, c coordinatorv1.CoordinatorServiceClient, req *coordinatorv1.CutoverRequest) (*coordinatorv1.PathCheckResult, error) {
				return c.PathCheck(ctx, req)
			})
			if err != nil {
				return err
			}
			if g.JSON() {
				if err := writeJSON(g.Stdout, res); err != nil {
					return err
				}
			} else {
				renderPathCheck(g.Stdout, res, true)
			}
			if n := len(res.GetProblems()); n > 0 {
				return Exitf(ExitProblems, "path check on udp/%d: %d problem(s); nothing was changed", req.GetPort(), n)
			}
			return nil
		},
	}
	t.add(cmd)
	for _, f := range []string{"allow-unprobed", "allow-path-problems"} {
		_ = cmd.Flags().MarkHidden(f) // a cutover's, not a check's
	}
	return cmd
}

// renderPathCheck prints the path check's matrix: a summary line, then
// every direction that did not pass (every direction with all).
func renderPathCheck(w io.Writer, pc *coordinatorv1.PathCheckResult, problems bool) {
	var vnis []string
	for _, v := range pc.GetVnis() {
		vnis = append(vnis, fmt.Sprint(v))
	}
	var sizes []string
	for _, z := range pc.GetSizes() {
		sizes = append(sizes, fmt.Sprint(z))
	}
	// A direction only the receiving node's own firewall drops passes the
	// underlay: Prepare opens the port (its row and a note say so).
	ok, fw := 0, 0
	for _, p := range pc.GetPairs() {
		switch p.GetVerdict() {
		case "ok":
			ok++
		case "node_firewall":
			fw++
		}
	}
	_, _ = fmt.Fprintf(w, "%s\n", wrap(fmt.Sprintf("path check: udp/%d, %d node(s), %s: %d of %d direction(s) pass; VNI %s (reference %d), sizes %s (overlay MTU %d + 50, DF); %s",
		pc.GetPort(), pc.GetNodes(), pc.GetSampling(), ok+fw, len(pc.GetPairs()), strings.Join(vnis, ","), pc.GetReferenceVni(),
		strings.Join(sizes, ","), pc.GetOverlayMtu(), fmtMicros(pc.GetTookMicros())), planWidth-2, "  "))
	for _, n := range pc.GetNotes() {
		_, _ = fmt.Fprintf(w, "  note: %s\n", wrap(n, planWidth-8, "        "))
	}
	for _, n := range pc.GetWarnings() {
		_, _ = fmt.Fprintf(w, "  warning: %s\n", wrap(n, planWidth-11, "           "))
	}
	if ok < len(pc.GetPairs()) {
		t := newTable(w)
		_, _ = fmt.Fprintln(t, "FROM\tTO\tVERDICT\tLARGEST PASSED\tDETAIL")
		for _, p := range pc.GetPairs() {
			if p.GetVerdict() == "ok" {
				continue
			}
			_, _ = fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%s\n", p.GetFrom(), p.GetTo(), p.GetVerdict(), p.GetLargestSize(), p.GetDetail())
		}
		_ = t.Flush()
	}
	if !problems {
		return
	}
	if len(pc.GetProblems()) == 0 {
		_, _ = fmt.Fprintln(w, "\nno problems: the underlay passes VXLAN on this port")
		return
	}
	_, _ = fmt.Fprintf(w, "\n%d problem(s):\n", len(pc.GetProblems()))
	for _, pr := range pc.GetProblems() {
		_, _ = fmt.Fprintf(w, "  - %s\n", wrap(pr, planWidth-4, "    "))
	}
}

func fmtMicros(us int64) string {
	if us >= 1000 {
		return fmt.Sprintf("took %d ms", us/1000)
	}
	return fmt.Sprintf("took %d µs", us)
}
