package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// Rendering is pure: messages in, text out, so golden tests cover it.

func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}.Marshal(m)
	if err != nil {
		return Exitf(ExitFailed, "encoding JSON: %v", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func renderAgents(w io.Writer, agents []*coordinatorv1.Agent) {
	if len(agents) == 0 {
		_, _ = fmt.Fprintln(w, "no agents known to the coordinator")
		return
	}
	t := newTable(w)
	_, _ = fmt.Fprintln(t, "NODE\tADDRESS\tVERSION\tBACKEND\tDEVICE\tPORT\tREADY\tOFFSET(ms)\tRTT(ms)")
	for _, a := range agents {
		ready := "yes"
		switch {
		case a.GetError() != "":
			ready = "unreachable: " + a.GetError()
		case !a.GetReady():
			ready = "no: " + orDash(strings.Join(a.GetNotReady(), ", "))
		}
		port := "-"
		if a.GetCurrentPort() != 0 {
			port = fmt.Sprint(a.GetCurrentPort())
		}
		_, _ = fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.GetNode(), orDash(a.GetAddress()), orDash(a.GetVersion()),
			orDash(a.GetBackend()), orDash(a.GetDevice()), port, ready, fmtMillis(a.GetClockOffsetNanos()), fmtMillis(a.GetRttNanos()))
	}
	_ = t.Flush()
}

// planProblems is every problem of a plan, operation-wide and per node.
func planProblems(p *coordinatorv1.PlanResponse) int {
	n := len(p.GetProblems())
	if n == 0 {
		for _, np := range p.GetNodes() {
			n += len(np.GetProblems())
		}
	}
	return n
}

// wrap breaks s at spaces into lines of at most width runes (a longer
// word stays whole), the ones after the first led by indent: a refusal
// that names nodes and says what to do runs long.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	line := 0
	for i, word := range strings.Fields(s) {
		n := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case line+1+n > width:
			b.WriteString("\n" + indent)
			line = 0
		default:
			b.WriteByte(' ')
			line++
		}
		b.WriteString(word)
		line += n
	}
	return b.String()
}

// renderStep prints one hook step as a list item: its first line wrapped
// like the rest of the output, each further line (a command to copy) on a
// line of its own, never broken, so that a paste runs it whole.
func renderStep(w io.Writer, step string) {
	text, cmds, _ := strings.Cut(step, "\n")
	_, _ = fmt.Fprintf(w, "  - %s\n", wrap(text, planWidth-4, "    "))
	for _, c := range strings.Split(cmds, "\n") {
		if c = strings.TrimSpace(c); c != "" {
			_, _ = fmt.Fprintf(w, "      %s\n", c)
		}
	}
}

func stateName(s coordinatorv1.OperationState) string {
	if s == coordinatorv1.OperationState_OPERATION_STATE_UNSPECIFIED {
		return "NOT RUN (dry run or preflight only)"
	}
	return strings.TrimPrefix(s.String(), "OPERATION_STATE_")
}

func renderReport(w io.Writer, r *coordinatorv1.Report) {
	_, _ = fmt.Fprintf(w, "operation %s: %s, port %d -> %d", orDash(r.GetOperationId()), stateName(r.GetState()), r.GetFromPort(), r.GetToPort())
	if r.GetStartedUnixNano() != 0 && r.GetEndedUnixNano() != 0 {
		_, _ = fmt.Fprintf(w, " in %s ms", fmtMillis(r.GetEndedUnixNano()-r.GetStartedUnixNano()))
	}
	_, _ = fmt.Fprintln(w)
	if r.GetRequestedBy() != "" {
		_, _ = fmt.Fprintf(w, "requested by %s\n", r.GetRequestedBy())
	}
	if r.GetError() != "" {
		_, _ = fmt.Fprintf(w, "error: %s\n", r.GetError())
	}
	if len(r.GetPhases()) > 0 {
		_, _ = fmt.Fprintln(w, "\nphases:")
		t := newTable(w)
		for _, p := range r.GetPhases() {
			_, _ = fmt.Fprintf(t, "  %s\t%s ms\n", p.GetPhase(), fmtMillis(p.GetNanos()))
		}
		_ = t.Flush()
	}
	if why := r.GetStrategyReason(); why != "" {
		_, _ = fmt.Fprintf(w, "\nstrategy: %s (%s)\n", r.GetStrategy(), why)
	}
	if r.GetStrategy() == "staged" {
		// No instant, so no commit spread: the batches are the timeline.
		renderBatches(w, r)
	} else if r.GetCommitSpreadNanos() != 0 || r.GetState() != coordinatorv1.OperationState_OPERATION_STATE_UNSPECIFIED {
		_, _ = fmt.Fprintf(w, "\ncommit spread: %s ms\n", fmtMillis(r.GetCommitSpreadNanos()))
		if m := r.GetCommitMarginNanos(); m > 0 {
			_, _ = fmt.Fprintf(w, "commit margin: %s ms (the last Commit reached its agent that long before the instant)\n", fmtMillis(m))
		} else if m < 0 {
			_, _ = fmt.Fprintf(w, "commit margin: %s ms: a Commit reached its agent after the instant (raise --commit-lead-min or --commit-lead-per-agent)\n", fmtMillis(m))
		}
	}
	if r.GetEffectSpreadNanos() != 0 || r.GetWriteSpreadNanos() != 0 {
		// The commit spread is when the agents woke; this is what the
		// overlay saw: the writes leaving and the dataplanes confirming.
		_, _ = fmt.Fprintf(w, "effect spread: %s ms (writes left within %s ms)\n", fmtMillis(r.GetEffectSpreadNanos()), fmtMillis(r.GetWriteSpreadNanos()))
	}
	for _, l := range r.GetLateNodes() {
		what := "did not apply"
		if l.GetApplied() {
			what = "applied"
		}
		_, _ = fmt.Fprintf(w, "late: %s %s, %s ms after the commit instant (budget %s ms, policy %s)\n", l.GetNode(), what,
			fmtMillis(l.GetLatenessNanos()), fmtMillis(r.GetLateBudgetNanos()), orDash(r.GetLatePolicy()))
	}
	if len(r.GetWarnings()) > 0 {
		_, _ = fmt.Fprintln(w, "\nwarnings:")
		for _, x := range r.GetWarnings() {
			_, _ = fmt.Fprintf(w, "  %s\n", x)
		}
	}
	if len(r.GetNodes()) > 0 {
		staged := slices.ContainsFunc(r.GetNodes(), func(n *coordinatorv1.NodeResult) bool { return n.GetStaged() != "" })
		_, _ = fmt.Fprintln(w)
		t := newTable(w)
		// ANSWER: the node's apply to its answer leaving (its own clock).
		head := "NODE\tPHASE\tPORT\tAPPLY(ms)\tANSWER(ms)\tOFFSET(ms)\tERROR"
		if staged {
			head = "NODE\tPHASE\tSTAGED\tPORT\tAPPLY(ms)\tANSWER(ms)\tOFFSET(ms)\tERROR"
		}
		_, _ = fmt.Fprintln(t, head)
		for _, n := range r.GetNodes() {
			answer := "-" // an agent that does not report it
			if a := n.GetApplyToAnswerNanos(); a != 0 {
				answer = fmtMillis(a)
			}
			st := ""
			if staged {
				st = orDash(n.GetStaged()) + "\t"
			}
			_, _ = fmt.Fprintf(t, "%s\t%s\t%s%d\t%s\t%s\t%s\t%s\n", n.GetNode(), orDash(strings.TrimPrefix(n.GetAgentPhase(), "PHASE_")), st, n.GetPort(),
				fmtMillis(n.GetApplyNanos()), answer, fmtMillis(n.GetClockOffsetNanos()), orDash(n.GetError()))
		}
		_ = t.Flush()
		renderHeld(w, r)
	}
	if len(r.GetDisruption()) > 0 || r.GetProbesSent() > 0 {
		_, _ = fmt.Fprintln(w, "\nprobe disruption:")
		t := newTable(w)
		// LOST IN: the phases the lost probes were sent in; GAP BEGAN IN:
		// where the pair waited longest, which is not where it lost when
		// its answers were only delayed there.
		_, _ = fmt.Fprintln(t, "  FROM\tTO\tSENT\tLOST\tLOST IN\tLONGEST GAP(ms)\tGAP BEGAN IN")
		for _, d := range r.GetDisruption() {
			_, _ = fmt.Fprintf(t, "  %s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.GetFrom(), d.GetTo(), d.GetSent(), d.GetLost(), fmtPhaseLosses(d.GetLostByPhase()),
				fmtMillis(d.GetLongestGapMicros()*1000), orDash(d.GetLongestGapPhase()))
		}
		_, _ = fmt.Fprintf(t, "  total\t\t%d\t%d\t%s\t%s\n", r.GetProbesSent(), r.GetProbesLost(), fmtPhaseLosses(r.GetLostByPhase()), fmtMillis(r.GetLongestGapMicros()*1000))
		_ = t.Flush()
		renderStalls(w, r)
	}
	// Last, so that it is what the admin reads when the command returns:
	// what the cluster still needs from a person now that the overlay is
	// on the new port.
	if n := r.GetNextSteps(); len(n) > 0 {
		_, _ = fmt.Fprintln(w, "\nnext steps (yours: the operation succeeded, these keep it so):")
		for _, x := range n {
			renderStep(w, x)
		}
	}
}

// renderHeld says, for a held staged operation, which nodes send which
// port and what the operator can do next.
func renderHeld(w io.Writer, r *coordinatorv1.Report) {
	if r.GetState() != coordinatorv1.OperationState_OPERATION_STATE_HELD {
		return
	}
	var sw, ls []string
	for _, n := range r.GetNodes() {
		if n.GetStaged() == "switched" {
			sw = append(sw, n.GetNode())
		} else {
			ls = append(ls, n.GetNode())
		}
	}
	id := orDash(r.GetOperationId())
	_, _ = fmt.Fprintf(w, "\nheld: every node listens on %d and %d; %d node(s) send %d (%s), %d still send %d (%s).\n",
		r.GetFromPort(), r.GetToPort(), len(sw), r.GetToPort(), abbreviateNodes(sw, 6), len(ls), r.GetFromPort(), abbreviateNodes(ls, 6))
	_, _ = fmt.Fprintf(w, "next: coordctl cutover --port %d --strategy staged [--nodes ...] switches more (the old port is retired once every node sends %d); coordctl rollback %s undoes it all\n",
		r.GetToPort(), r.GetToPort(), id)
}

// stallNotable is the agent stall the report points out: below it, a
// probe gap is the overlay's within the probe interval's noise.
const stallNotable = 10 * time.Millisecond

// renderStalls names the nodes whose agent fell behind its probe mesh by
// stallNotable or more: their pairs' gaps include that time, which the
// overlay did not cause (a machine that did not run the agent).
func renderStalls(w io.Writer, r *coordinatorv1.Report) {
	var s []string
	for _, n := range r.GetNodes() {
		if d := time.Duration(n.GetProbeStallMicros()) * time.Microsecond; d >= stallNotable {
			s = append(s, fmt.Sprintf("%s %s ms", n.GetNode(), fmtMillis(d.Nanoseconds())))
		}
	}
	if len(s) > 0 {
		_, _ = fmt.Fprintf(w, "  agents behind their probes (the gaps to and from these nodes include it; the overlay did not cause it): %s\n", strings.Join(s, ", "))
	}
}

// eventLine is one event as a plain line (non-TTY output).
func eventLine(e *coordinatorv1.OperationEvent) string {
	ts := "--:--:--.---"
	if e.GetUnixNano() != 0 {
		ts = time.Unix(0, e.GetUnixNano()).UTC().Format("15:04:05.000")
	}
	result := "ok"
	if e.GetFailed() {
		result = "FAILED"
	}
	return fmt.Sprintf("%s %-9s %-12s %-6s %s", ts, orDash(e.GetPhase()), orDash(e.GetNode()), result, e.GetMessage())
}

// renderBatches is a staged operation's batches: who switched when, and
// when the probe mesh passed after it.
func renderBatches(w io.Writer, r *coordinatorv1.Report) {
	waves := ""
	if k := r.GetMaxParallel(); k > 0 {
		waves = fmt.Sprintf(", at most %d node(s) changing at a time", k)
	}
	_, _ = fmt.Fprintf(w, "\nstrategy: staged, %d batch(es)%s\n", len(r.GetBatches()), waves)
	t := newTable(w)
	_, _ = fmt.Fprintln(t, "  BATCH\tNODES\tSWITCHED(+ms)\tVERIFIED(+ms)")
	at := func(ns int64) string {
		if ns == 0 || r.GetStartedUnixNano() == 0 {
			return "-"
		}
		return fmtMillis(ns - r.GetStartedUnixNano())
	}
	for i, b := range r.GetBatches() {
		_, _ = fmt.Fprintf(t, "  %d\t%s\t%s\t%s\n", i+1, abbreviateNodes(b.GetNodes(), 6), at(b.GetSwitchedUnixNano()), at(b.GetVerifiedUnixNano()))
	}
	_ = t.Flush()
}

func abbreviateNodes(ns []string, n int) string {
	if len(ns) <= n {
		return strings.Join(ns, ",")
	}
	return strings.Join(ns[:n], ",") + fmt.Sprintf(",… (%d more)", len(ns)-n)
}

// fmtPhaseLosses is "commit 5, finalize 2" ("before" for probes sent
// before the first phase began), "-" for none.
func fmtPhaseLosses(ls []*coordinatorv1.PhaseLoss) string {
	if len(ls) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		ph := l.GetPhase()
		if ph == "" {
			ph = "before"
		}
		parts = append(parts, fmt.Sprintf("%s %d", ph, l.GetLost()))
	}
	return strings.Join(parts, ", ")
}
