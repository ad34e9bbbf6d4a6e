package cli

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The change record is the page an operator attaches to a change ticket:
// everything the report carries, laid out for people. recordView is the
// report reshaped for the template: times as text and as milliseconds
// since the operation started (the page's one time axis), so the template
// and its script compute nothing but layout.

type recordView struct {
	Title       string
	ID          string
	Kind        string
	Reverts     string
	State       string
	StateClass  string // ok, warn, bad, running
	Partial     bool   // still running: the record is as of Generated
	From, To    uint32
	RequestedBy string
	Started     string
	Ended       string
	Generated   string
	Duration    string
	Error       string
	Warnings    []string
	NextSteps   []string

	Request []kv
	Plan    *planView
	Phases  []phaseView
	Nodes   []nodeView
	Late    []string
	Events  []eventView
	Probes  probeTotals
	Spread  string
	// Staged: the strategy's batches (empty for atomic).
	Staged   bool
	Batches  []batchView
	CommitAt string

	// Data is what the page's script draws the timeline and the heatmap
	// from; html/template writes it as JSON, escaped for a script.
	Data chartData
}

type kv struct{ K, V string }

// batchView is one batch of a staged operation.
type batchView struct {
	N                  int
	Nodes              string
	Switched, Verified string
}

// pathView is the underlay path check the preflight ran (docs/pathcheck.md).
type pathView struct {
	Port, Control uint32
	VNIs          string
	Sizes         string
	Sampling      string
	Nodes, Pairs  uint32
	Verdicts      []kv // verdict → how many directions
	Problems      []string
	Notes         []string
	Took          string
}

type planView struct {
	Path                    *pathView
	CurrentPort, TargetPort uint32
	Nodes                   []planNodeView
	Groups                  []planGroupView
	Problems                []string
}

type planNodeView struct {
	Node, Current, Free, Actions, Problems string
}

type planGroupView struct {
	Label   string
	Who     string   // "every node (N)" or "N node(s)"
	Nodes   []string // named when not every node
	Actions []string
}

type phaseView struct{ Phase, Took string }

type nodeView struct {
	Node, Backend, Device, Port, Phase, Applied, ApplyTook, Offset, Reverted, Error string
	PortClass                                                                       string // ok when on the port the outcome says, else bad
}

type eventView struct {
	At, Phase, Node, Message string
	Failed                   bool
}

type probeTotals struct {
	Sent, Lost uint64
	LongestGap string
	Pairs      int
	LostIn     string // the phases the lost probes were sent in; "" for none
}

// chartData is the page script's input. Times are milliseconds since the
// operation started; -1 means never.
type chartData struct {
	EndMs    float64 `json:"endMs"`
	CommitMs float64 `json:"commitMs"`
	// Batches are a staged operation's batch switch instants (ms; -1
	// never): drawn as lines where the atomic strategy draws the commit.
	Batches []float64    `json:"batches,omitempty"`
	Phases  []chartPhase `json:"phases"`
	Nodes   []chartNode  `json:"nodes"`
	// Pairs are [from, to, sent, lost, longest gap ms], from and to
	// indexes into Names: at 200 nodes a full mesh is 39,800 pairs, and
	// names spelled out would make the page megabytes.
	Pairs [][5]float64  `json:"pairs"`
	Names []string      `json:"names"` // heatmap axis: every node, in report order
	Steps []chartMarker `json:"steps"` // legend: the step markers, in order
}

type chartPhase struct {
	Phase   string  `json:"phase"`
	StartMs float64 `json:"startMs"`
	EndMs   float64 `json:"endMs"`
}

type chartNode struct {
	Node        string  `json:"node"`
	PreparedMs  float64 `json:"preparedMs"`
	AppliedMs   float64 `json:"appliedMs"`
	ConfirmedMs float64 `json:"confirmedMs"`
	FinalizedMs float64 `json:"finalizedMs"`
	RevertedMs  float64 `json:"revertedMs"`
	RevertedBy  string  `json:"revertedBy"`
	Error       string  `json:"error"`
}

type chartMarker struct {
	Key   string `json:"key"`
	Label string `json:"label"`
}

func fmtInstant(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format("2006-01-02 15:04:05.000 UTC")
}

func stateClass(r *coordinatorv1.Report) string {
	switch r.GetState() {
	case coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED:
		if len(r.GetWarnings()) > 0 {
			return "warn"
		}
		return "ok"
	case coordinatorv1.OperationState_OPERATION_STATE_RUNNING, coordinatorv1.OperationState_OPERATION_STATE_HELD:
		return "running"
	case coordinatorv1.OperationState_OPERATION_STATE_ABORTED, coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK:
		return "warn"
	}
	return "bad"
}

// newRecordView reshapes r; now is when the record is made (the end of the
// axis of a running operation).
func newRecordView(r *coordinatorv1.Report, now time.Time) *recordView {
	start := r.GetStartedUnixNano()
	end := r.GetEndedUnixNano()
	running := r.GetState() == coordinatorv1.OperationState_OPERATION_STATE_RUNNING
	if end == 0 {
		end = now.UnixNano()
	}
	rel := func(ns int64) float64 {
		if ns == 0 || start == 0 {
			return -1
		}
		return float64(ns-start) / 1e6
	}
	v := &recordView{
		ID: orDash(r.GetOperationId()), Kind: orDash(r.GetKind()), Reverts: r.GetRevertsOperationId(),
		State: stateName(r.GetState()), StateClass: stateClass(r), Partial: running,
		From: r.GetFromPort(), To: r.GetToPort(), RequestedBy: orDash(r.GetRequestedBy()),
		Started: fmtInstant(start), Ended: fmtInstant(r.GetEndedUnixNano()), Generated: fmtInstant(now.UnixNano()),
		Error: r.GetError(), Warnings: r.GetWarnings(), NextSteps: r.GetNextSteps(), CommitAt: fmtInstant(r.GetCommitUnixNano()),
		Spread: fmtMillis(r.GetCommitSpreadNanos()) + " ms",
	}
	v.Title = fmt.Sprintf("Change record: operation %s, VXLAN port %d → %d, %s", v.ID, v.From, v.To, v.State)
	if start != 0 {
		v.Duration = fmtMillis(end-start) + " ms"
		if running {
			v.Duration += " so far"
		}
	}
	if q := r.GetRequest(); q != nil {
		v.Request = requestKV(q)
		if why := r.GetStrategyReason(); why != "" {
			v.Request = append(v.Request, kv{"strategy run", r.GetStrategy() + " (" + why + ")"})
		}
	}
	if p := r.GetPlan(); p != nil {
		v.Plan = newPlanView(p)
	}

	if r.GetStrategy() == "staged" {
		v.Staged = true
		for i, b := range r.GetBatches() {
			v.Batches = append(v.Batches, batchView{N: i + 1, Nodes: strings.Join(b.GetNodes(), ", "),
				Switched: fmtInstant(b.GetSwitchedUnixNano()), Verified: fmtInstant(b.GetVerifiedUnixNano())})
		}
	}
	data := chartData{EndMs: rel(end), CommitMs: rel(r.GetCommitUnixNano()),
		Steps: []chartMarker{{"prepared", "prepared (new port open)"}, {"applied", "applied (flipped)"}, {"confirmed", "confirmed"}, {"finalized", "finalized (old port closed)"}, {"reverted", "reverted"}}}
	at := start
	for _, p := range r.GetPhases() {
		v.Phases = append(v.Phases, phaseView{p.GetPhase(), fmtMillis(p.GetNanos()) + " ms"})
		data.Phases = append(data.Phases, chartPhase{Phase: p.GetPhase(), StartMs: rel(at), EndMs: rel(at + p.GetNanos())})
		at += p.GetNanos()
	}
	for _, b := range r.GetBatches() {
		data.Batches = append(data.Batches, rel(b.GetSwitchedUnixNano()))
	}
	wantPort := r.GetToPort()
	if st := r.GetState(); st == coordinatorv1.OperationState_OPERATION_STATE_ABORTED || st == coordinatorv1.OperationState_OPERATION_STATE_ROLLED_BACK ||
		st == coordinatorv1.OperationState_OPERATION_STATE_HELD {
		// Held: the devices keep the old port until the retirement; where
		// each node sends is its staged state.
		wantPort = r.GetFromPort()
	}
	for _, n := range r.GetNodes() {
		nv := nodeView{Node: n.GetNode(), Backend: orDash(n.GetBackend()), Device: orDash(n.GetDevice()), Port: "-",
			Phase: orDash(strings.TrimPrefix(n.GetAgentPhase(), "PHASE_")), Applied: fmtInstant(n.GetAppliedUnixNano()),
			ApplyTook: fmtMillis(n.GetApplyNanos()), Offset: fmtMillis(n.GetClockOffsetNanos()), Reverted: "-", Error: n.GetError(), PortClass: "bad"}
		if n.GetPort() != 0 {
			nv.Port = fmt.Sprint(n.GetPort())
		}
		if s := n.GetStaged(); s != "" {
			nv.Phase += " · " + s // listening, switched, retired
		}
		if n.GetPort() == wantPort || running {
			nv.PortClass = "ok"
		}
		if n.GetRevertedUnixNano() != 0 {
			nv.Reverted = fmtInstant(n.GetRevertedUnixNano()) + " (" + orDash(n.GetRevertedBy()) + ")"
		}
		v.Nodes = append(v.Nodes, nv)
		data.Names = append(data.Names, n.GetNode())
		data.Nodes = append(data.Nodes, chartNode{Node: n.GetNode(), PreparedMs: rel(n.GetPreparedUnixNano()), AppliedMs: rel(n.GetAppliedUnixNano()),
			ConfirmedMs: rel(n.GetConfirmedUnixNano()), FinalizedMs: rel(n.GetFinalizedUnixNano()), RevertedMs: rel(n.GetRevertedUnixNano()),
			RevertedBy: n.GetRevertedBy(), Error: n.GetError()})
	}
	idx := map[string]int{}
	for i, n := range data.Names {
		idx[n] = i
	}
	at2 := func(name string) float64 {
		// A pair may name a node the report does not list (a peer outside
		// the operation): the heatmap gets an axis entry for it.
		i, ok := idx[name]
		if !ok {
			i = len(data.Names)
			idx[name] = i
			data.Names = append(data.Names, name)
		}
		return float64(i)
	}
	for _, d := range r.GetDisruption() {
		data.Pairs = append(data.Pairs, [5]float64{at2(d.GetFrom()), at2(d.GetTo()), float64(d.GetSent()), float64(d.GetLost()), float64(d.GetLongestGapMicros()) / 1000})
	}
	v.Probes = probeTotals{Sent: r.GetProbesSent(), Lost: r.GetProbesLost(), LongestGap: fmtMillis(r.GetLongestGapMicros()*1000) + " ms", Pairs: len(r.GetDisruption())}
	if len(r.GetLostByPhase()) > 0 {
		v.Probes.LostIn = fmtPhaseLosses(r.GetLostByPhase())
	}
	for _, l := range r.GetLateNodes() {
		what := "did not apply"
		if l.GetApplied() {
			what = "applied"
		}
		v.Late = append(v.Late, fmt.Sprintf("%s %s, %s ms after the commit instant (budget %s ms, policy %s)", l.GetNode(), what,
			fmtMillis(l.GetLatenessNanos()), fmtMillis(r.GetLateBudgetNanos()), orDash(r.GetLatePolicy())))
	}
	for _, e := range r.GetEvents() {
		v.Events = append(v.Events, eventView{At: fmtInstant(e.GetUnixNano()), Phase: orDash(e.GetPhase()), Node: orDash(e.GetNode()), Message: e.GetMessage(), Failed: e.GetFailed()})
	}
	v.Data = data
	return v
}

func requestKV(q *coordinatorv1.CutoverRequest) []kv {
	out := []kv{{"port", fmt.Sprint(q.GetPort())}}
	nodes := "every node"
	if len(q.GetNodes()) > 0 {
		nodes = strings.Join(q.GetNodes(), ", ")
	}
	out = append(out, kv{"nodes", nodes})
	if q.GetSelector() != "" {
		out = append(out, kv{"selector", q.GetSelector()})
	}
	step := "coordinator default"
	if q.GetTimeoutMillis() != 0 {
		step = fmt.Sprintf("%d ms", q.GetTimeoutMillis())
	}
	out = append(out, kv{"step timeout", step})
	switch q.GetStrategy() {
	case "":
		out = append(out, kv{"strategy", "none named: the coordinator's --default-strategy (auto, unless set to atomic)"})
	case "auto":
		out = append(out, kv{"strategy", "auto (staged where every node accepts it and loses less with it, else atomic)"})
	case "staged":
		batches := "1, 100% (default)"
		if len(q.GetBatches()) > 0 {
			batches = strings.Join(q.GetBatches(), ", ")
		}
		waves := "a tenth of the nodes (default)"
		if k := q.GetMaxParallel(); k > 0 {
			waves = strconv.FormatUint(uint64(k), 10)
		}
		out = append(out, kv{"strategy", "staged (make-before-break)"}, kv{"batches", batches}, kv{"nodes changing at a time", waves})
	}
	var allow []string
	if q.GetAllowNodeportRange() {
		allow = append(allow, "port in the NodePort range")
	}
	if q.GetAllowTunnelPort() {
		allow = append(allow, "another tunnel's port")
	}
	if q.GetAllowUnprobed() {
		allow = append(allow, "unprobed nodes")
	}
	if len(allow) > 0 {
		out = append(out, kv{"allowed", strings.Join(allow, ", ")})
	}
	if q.GetOperationId() != "" {
		out = append(out, kv{"operation id asked", q.GetOperationId()})
	}
	return out
}

func newPlanView(p *coordinatorv1.PlanResponse) *planView {
	pv := &planView{CurrentPort: p.GetCurrentPort(), TargetPort: p.GetTargetPort(), Problems: p.GetProblems(), Path: newPathView(p.GetPathCheck())}
	groups, byNode := groupActions(p.GetNodes())
	for _, n := range p.GetNodes() {
		act := "-"
		if g := byNode[n.GetNode()]; g != nil {
			act = g.label
		}
		pv.Nodes = append(pv.Nodes, planNodeView{Node: n.GetNode(), Current: fmt.Sprint(n.GetCurrentPort()), Free: yesNo(n.GetTargetPortFree()),
			Actions: act, Problems: orDash(strings.Join(n.GetProblems(), "; "))})
	}
	for _, g := range groups {
		gv := planGroupView{Label: g.label, Who: fmt.Sprintf("every node (%d)", len(g.nodes)), Actions: g.actions}
		if len(g.nodes) < len(p.GetNodes()) {
			gv.Who, gv.Nodes = fmt.Sprintf("%d node(s)", len(g.nodes)), g.nodes
		}
		pv.Groups = append(pv.Groups, gv)
	}
	return pv
}

// pathNotes are the path check's notes, then its warnings (problems the
// current port has as well), marked.
func pathNotes(pc *coordinatorv1.PathCheckResult) []string {
	out := slices.Clone(pc.GetNotes())
	for _, w := range pc.GetWarnings() {
		out = append(out, "warning: "+w)
	}
	return out
}

func newPathView(pc *coordinatorv1.PathCheckResult) *pathView {
	if pc == nil {
		return nil
	}
	join := func(us []uint32) string {
		var ss []string
		for _, u := range us {
			ss = append(ss, fmt.Sprint(u))
		}
		return orDash(strings.Join(ss, ", "))
	}
	v := &pathView{Port: pc.GetPort(), Control: pc.GetControlPort(), VNIs: join(pc.GetVnis()), Sizes: join(pc.GetSizes()),
		Sampling: orDash(pc.GetSampling()), Nodes: pc.GetNodes(), Pairs: pc.GetPairsChecked(), Problems: pc.GetProblems(), Notes: pathNotes(pc),
		Took: fmtMillis(pc.GetTookMicros()*1000) + " ms"}
	count := map[string]int{}
	var order []string
	for _, p := range pc.GetPairs() {
		if count[p.GetVerdict()] == 0 {
			order = append(order, p.GetVerdict())
		}
		count[p.GetVerdict()]++
	}
	for _, verdict := range order {
		v.Verdicts = append(v.Verdicts, kv{verdict, fmt.Sprint(count[verdict])})
	}
	return v
}
