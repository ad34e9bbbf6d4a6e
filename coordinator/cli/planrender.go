package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The plan as a person reads it: one short row per node, and the actions
// (long: full iptables rules and OVSDB transactions, identical on most
// nodes) listed once per group of nodes that share them. The table must
// fit a terminal: planWidth bounds every line of it.

// planWidth is the widest line the compact plan prints (a 100-column
// terminal keeps one column free for the cursor).
const planWidth = 99

// maxNodeCell bounds the node column: a longer name is shortened in the
// middle (its start and end are what tell nodes apart); the problems list
// below the table and -o wide give it whole.
const maxNodeCell = 40

// pathCheckCell is the plan table's path-check column for a node: empty
// while the plan carries no path-check result (the column is then left
// out); else "ok", or how many of the node's directions did not pass, by
// verdict ("2 blocked", "1 mtu"). The matrix follows the table.
func pathCheckCell(p *coordinatorv1.PlanResponse, n *coordinatorv1.NodePlan) string {
	pc := p.GetPathCheck()
	if pc == nil {
		return ""
	}
	count := map[string]int{}
	var kinds []string
	for _, pp := range pc.GetPairs() {
		if pp.GetVerdict() == "ok" || (pp.GetFrom() != n.GetNode() && pp.GetTo() != n.GetNode()) {
			continue
		}
		if count[pp.GetVerdict()] == 0 {
			kinds = append(kinds, pp.GetVerdict())
		}
		count[pp.GetVerdict()]++
	}
	if len(kinds) == 0 {
		return "ok"
	}
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", count[k], k))
	}
	return strings.Join(parts, ", ")
}

// actionGroup is one distinct list of actions and the nodes it applies to,
// in plan order.
type actionGroup struct {
	label   string
	actions []string
	nodes   []string
}

// groupActions groups nodes by identical action lists, in order of first
// appearance, and labels the groups A, B, … (A1, B1, … past Z).
func groupActions(nodes []*coordinatorv1.NodePlan) (groups []*actionGroup, byNode map[string]*actionGroup) {
	byKey := map[string]*actionGroup{}
	byNode = map[string]*actionGroup{}
	for _, n := range nodes {
		if len(n.GetActions()) == 0 {
			continue
		}
		key := strings.Join(n.GetActions(), "\x00")
		g, ok := byKey[key]
		if !ok {
			g = &actionGroup{label: groupLabel(len(groups)), actions: n.GetActions()}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.nodes = append(g.nodes, n.GetNode())
		byNode[n.GetNode()] = g
	}
	return groups, byNode
}

func groupLabel(i int) string {
	l := string(rune('A' + i%26))
	if i >= 26 {
		l += fmt.Sprint(i / 26)
	}
	return l
}

// shorten cuts s to at most n runes, keeping its start and end around an
// ellipsis.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return "…"
	}
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// clip cuts s to at most n runes with a trailing ellipsis.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return "…"
	}
	return string(r[:n-1]) + "…"
}

// padRight pads s with spaces to n runes.
func padRight(s string, n int) string {
	if k := utf8.RuneCountInString(s); k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}

// renderPlan prints the compact plan; wide adds every node's actions in
// full (-o wide).
func renderPlan(w io.Writer, p *coordinatorv1.PlanResponse, wide bool) {
	_, _ = fmt.Fprintf(w, "plan: port %d -> %d on %d node(s); nothing was changed\n\n", p.GetCurrentPort(), p.GetTargetPort(), len(p.GetNodes()))
	if why := p.GetStrategyReason(); why != "" {
		_, _ = fmt.Fprintf(w, "%s\n\n", wrap(fmt.Sprintf("strategy: %s (%s)", p.GetStrategy(), why), planWidth-2, "  "))
	}
	groups, byNode := groupActions(p.GetNodes())

	header := []string{"NODE", "CURRENT", "NEW PORT FREE"}
	withPath := slices.ContainsFunc(p.GetNodes(), func(n *coordinatorv1.NodePlan) bool { return pathCheckCell(p, n) != "" })
	if withPath {
		header = append(header, "PATH CHECK")
	}
	header = append(header, "ACTIONS", "PROBLEMS")
	rows := make([][]string, 0, len(p.GetNodes()))
	for _, n := range p.GetNodes() {
		act := "-"
		if g := byNode[n.GetNode()]; g != nil {
			act = g.label
		}
		row := []string{shorten(n.GetNode(), maxNodeCell), fmt.Sprint(n.GetCurrentPort()), yesNo(n.GetTargetPortFree())}
		if withPath {
			row = append(row, clip(orDash(pathCheckCell(p, n)), 16))
		}
		row = append(row, act, problemCell(n.GetProblems()))
		rows = append(rows, row)
	}
	writeFitted(w, header, rows, planWidth)

	if len(groups) > 0 {
		_, _ = fmt.Fprintln(w, "\nactions (in order; ACTIONS above names the list each node runs):")
		// The biggest group is named by what it is not: at 200 nodes its
		// list of names would be most of the page.
		most := groups[0]
		for _, g := range groups {
			if len(g.nodes) > len(most.nodes) {
				most = g
			}
		}
		for _, g := range groups {
			var who string
			switch {
			case len(g.nodes) == len(p.GetNodes()):
				who = fmt.Sprintf("every node (%d)", len(g.nodes))
			case g == most && len(groups) > 1:
				who = fmt.Sprintf("%d node(s): every node not named in another list (-o wide names them)", len(g.nodes))
			default:
				who = fmt.Sprintf("%d node(s): %s", len(g.nodes), strings.Join(g.nodes, ", "))
			}
			_, _ = fmt.Fprintf(w, "  %s  on %s\n", g.label, wrap(who, planWidth-6, "      "))
			for i, a := range g.actions {
				_, _ = fmt.Fprintf(w, "     %2d. %s\n", i+1, wrap(a, planWidth-9, "         "))
			}
		}
	}
	if steps := p.GetHookSteps(); len(steps) > 0 {
		_, _ = fmt.Fprintln(w, "\ncluster (the coordinator's hooks, on the API; the admin's part is named):")
		for _, s := range steps {
			renderStep(w, s)
		}
	}
	if pc := p.GetPathCheck(); pc != nil {
		_, _ = fmt.Fprintln(w)
		renderPathCheck(w, pc, false)
	}
	if wide {
		renderPlanWide(w, p)
	}

	probs := p.GetProblems()
	if len(probs) == 0 {
		for _, n := range p.GetNodes() {
			for _, pr := range n.GetProblems() {
				probs = append(probs, n.GetNode()+": "+pr)
			}
		}
	}
	if len(probs) == 0 {
		_, _ = fmt.Fprintln(w, "\nno problems: the cutover may go")
		return
	}
	_, _ = fmt.Fprintf(w, "\n%d problem(s):\n", len(probs))
	for _, pr := range probs {
		_, _ = fmt.Fprintf(w, "  - %s\n", wrap(pr, planWidth-4, "    "))
	}
}

// renderPlanWide lists each node's own actions in full, one per line.
func renderPlanWide(w io.Writer, p *coordinatorv1.PlanResponse) {
	_, _ = fmt.Fprintln(w, "\nactions per node:")
	for _, n := range p.GetNodes() {
		_, _ = fmt.Fprintf(w, "  %s (port %d, new port free: %s)\n", n.GetNode(), n.GetCurrentPort(), yesNo(n.GetTargetPortFree()))
		if len(n.GetActions()) == 0 {
			_, _ = fmt.Fprintln(w, "     none")
		}
		for i, a := range n.GetActions() {
			_, _ = fmt.Fprintf(w, "     %2d. %s\n", i+1, wrap(a, planWidth-9, "         "))
		}
		for _, pr := range n.GetProblems() {
			_, _ = fmt.Fprintf(w, "     problem: %s\n", wrap(pr, planWidth-14, "              "))
		}
	}
}

// problemCell is the table's short form of a node's problems: how many
// (first, as the end of a long one is clipped) and the first; the full
// list follows the table.
func problemCell(probs []string) string {
	switch len(probs) {
	case 0:
		return "-"
	case 1:
		return probs[0]
	}
	return fmt.Sprintf("(%d) %s", len(probs), probs[0])
}

// writeFitted writes a table with two spaces between columns whose last
// column is clipped so that no line exceeds width.
func writeFitted(w io.Writer, header []string, rows [][]string, width int) {
	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	last := len(header) - 1
	lead := 0
	for i := range last {
		lead += widths[i] + 2
	}
	room := max(width-lead, utf8.RuneCountInString(header[last]))
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == last {
				b.WriteString(clip(c, room))
				continue
			}
			b.WriteString(padRight(c, widths[i]+2))
		}
		_, _ = fmt.Fprintln(w, b.String())
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
}
