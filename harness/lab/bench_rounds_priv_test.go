package lab_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// roundFigure is one method's row in one round.
type roundFigure struct {
	Round int `json:"round"`
	// Position is the method's place in its round (0 first): the order
	// turns by one each round.
	Position int `json:"position"`
	cutoverFigure
}

// nodeTiming is where one node's time went in one atomic cutover (or the
// limit's release), each a difference of two of the report's per-node
// instants (NodeResult), all in milliseconds. The instants of one node
// come from its agent's clock through one offset, so a difference of two
// of them carries no offset error; WakeLate compares with the
// coordinator's instant and carries the offset's.
type nodeTiming struct {
	Backend string `json:"backend"`
	Method  string `json:"method"` // cutover, limit
	Round   int    `json:"round"`
	Node    string `json:"node"`
	// Margin is the commit instant minus when the Commit call reached the
	// agent (commit_received_unix_nano): how long it slept.
	MarginMS float64 `json:"margin_ms,omitempty"`
	// WakeLate is the wake-up (applied_unix_nano) minus the instant.
	WakeLateMS float64 `json:"wake_late_ms"`
	// WakeToWrite is the agent's own code from the wake-up to the write
	// leaving for the dataplane (written_unix_nano).
	WakeToWriteMS float64 `json:"wake_to_write_ms"`
	// WriteToEffect is the dataplane's: OVS, the transaction sent to
	// ovs-vswitchd's cur_cfg confirmation; kernel, the netlink window
	// (effective_unix_nano - written_unix_nano).
	WriteToEffectMS float64 `json:"write_to_effect_ms"`
	// EffectToAnswer is from the confirmation to the Commit answer
	// leaving (apply_to_answer_nanos minus wake → effect): the read-back
	// and the agent's bookkeeping before it answers.
	EffectToAnswerMS float64 `json:"effect_to_answer_ms,omitempty"`
	// Effect is the effective instant minus the instant.
	EffectMS float64 `json:"effect_ms"`
}

// stat is the median and the range of a figure over rounds (or nodes).
// The median of an even count is the upper of the two middle values, as
// benchresult.Summarize takes it.
type stat struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return stat{N: len(s), Median: s[len(s)/2], Min: s[0], Max: s[len(s)-1]}
}

// methodSummary is one method's figures over the rounds of a backend.
type methodSummary struct {
	Backend        string `json:"backend"`
	Nodes          int    `json:"nodes"`
	Method         string `json:"method"`
	Rounds         int    `json:"rounds"`
	Lost           stat   `json:"probes_lost"`
	Sent           stat   `json:"probes_sent"`
	MaxPairLost    stat   `json:"max_lost_per_pair"`
	LongestGapMS   stat   `json:"longest_gap_ms"`
	CommitSpreadMS stat   `json:"commit_spread_ms"`
	WriteSpreadMS  stat   `json:"write_spread_ms"`
	EffectSpreadMS stat   `json:"effect_spread_ms"`
	WallMS         stat   `json:"wall_ms"`
	IdleLostPerS   stat   `json:"idle_lost_per_s"`
	LossVsLimit    stat   `json:"loss_vs_limit"`
}

// effectBreakdown is where a backend's cutover effect spread goes, over
// its rounds: each component's value over every node of every round, its
// spread over the nodes of a round (max - min) over the rounds, and the
// effect spread split between the node that confirmed last and the one
// that confirmed first: Δwake + Δ(wake → write) + Δ(write → effect) adds
// up to the effect spread exactly.
type effectBreakdown struct {
	Backend string `json:"backend"`
	Method  string `json:"method"`
	// Over every node of every round.
	WakeLateMS       stat `json:"wake_late_ms"`
	WakeToWriteMS    stat `json:"wake_to_write_ms"`
	WriteToEffectMS  stat `json:"write_to_effect_ms"`
	EffectToAnswerMS stat `json:"effect_to_answer_ms"`
	// Over rounds: each round's spread over its nodes.
	WakeLateSpreadMS      stat `json:"wake_late_spread_ms"`
	WakeToWriteSpreadMS   stat `json:"wake_to_write_spread_ms"`
	WriteToEffectSpreadMS stat `json:"write_to_effect_spread_ms"`
	EffectSpreadMS        stat `json:"effect_spread_ms"`
	// Over rounds: the last-confirmed node minus the first-confirmed.
	LastFirstWakeMS          stat `json:"last_minus_first_wake_ms"`
	LastFirstWakeToWriteMS   stat `json:"last_minus_first_wake_to_write_ms"`
	LastFirstWriteToEffectMS stat `json:"last_minus_first_write_to_effect_ms"`
}

type roundsResults struct {
	Nodes          int               `json:"nodes"`
	Rounds         int               `json:"rounds"`
	Methods        []string          `json:"methods"`
	Summary        []methodSummary   `json:"summary"`
	EffectSpread   []effectBreakdown `json:"effect_breakdown"`
	Rows           []roundFigure     `json:"rounds_rows"`
	NodeTimings    []nodeTiming      `json:"node_timings"`
	LateBudgetNote string            `json:"late_budget"`
}

// BenchmarkLabCutoverRounds changes the overlay port of one lab per
// backend (COT_LAB_BENCH_BACKENDS) of COT_LAB_BENCH_NODES nodes (8) in
// COT_LAB_BENCH_ROUNDS rounds (5), every method of COT_LAB_BENCH_METHODS
// (limit,parallel,cutover,staged; BenchmarkLabCutover says what each is;
// limit is limitOVS or limitKernel) once per round, the order turned by one each round:
// a run of noise (another lab's test, a burst of load) then lands on
// every method rather than on one, and each method's median and range
// over the rounds show the noise floor beside its figure. A coordctl
// method moves the lab from its port to the other of 4889 and 4989 (the
// first from the backend's default port to 4889); a direct one goes there
// and back.
//
// For every atomic cutover it keeps where each node's time went, from the
// report's per-node instants (nodeTiming), and sums up per backend where
// the effect spread comes from (effectBreakdown); the limit's own write
// to effect per node is beside it.
//
// Writes results/<COT_LAB_BENCH_NAME>.json (lab_cutover_n8) and its tables
// in docs/benchmarks.md.
func BenchmarkLabCutoverRounds(b *testing.B) {
	testenv.RequirePrivileged(b, append(ovsBins, labtest.BuildTools()...)...)
	bin := labtest.Binaries(b)
	interval := envDur("COT_LAB_BENCH_INTERVAL", time.Millisecond)
	peers := envInt("COT_LAB_BENCH_PEERS", 2)
	n := envInt("COT_LAB_BENCH_NODES", 8)
	rounds := envInt("COT_LAB_BENCH_ROUNDS", 5)
	methods := strings.Split(envOr("COT_LAB_BENCH_METHODS", "limit,parallel,cutover,staged"), ",")
	for _, m := range methods {
		if !slices.Contains([]string{"sequential", "parallel", "limit", "cutover", "staged"}, m) {
			b.Fatalf("COT_LAB_BENCH_METHODS: %q: want sequential, parallel, limit, cutover or staged", m)
		}
	}
	backends := strings.Split(envOr("COT_LAB_BENCH_BACKENDS", lab.BackendOVS+","+lab.BackendKernelVXLAN), ",")
	res := roundsResults{Nodes: n, Rounds: rounds, Methods: methods, LateBudgetNote: lateBudget()}
	for _, backend := range backends {
		b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
			for b.Loop() {
				rows, timings := benchRounds(b, bin, backend, n, interval, peers, rounds, methods)
				res.Rows = append(res.Rows, rows...)
				res.NodeTimings = append(res.NodeTimings, timings...)
			}
		})
	}
	res.Summary = summarizeRounds(res.Rows)
	res.EffectSpread = breakDown(res.NodeTimings)
	writeRoundsResults(b, res)
}

func benchRounds(b *testing.B, bin, backend string, n int, interval time.Duration, peers, rounds int, methods []string) ([]roundFigure, []nodeTiming) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bl := upBenchLab(b, ctx, bin, backend, n, interval, peers)
	defer bl.down()
	// The coordinator refuses a well-known tunnel port (the lab's
	// default is one) without --allow-tunnel-port: after the first
	// coordctl method leaves it, the lab moves between two others.
	cur := lab.DefaultPort[backend]
	other := func() int {
		if cur == 4889 {
			return 4989
		}
		return 4889
	}
	var rows []roundFigure
	var timings []nodeTiming
	for r := range rounds {
		bl.base.IdleLost = bl.idle(time.Second)
		for pos := range methods {
			method := methods[(r+pos)%len(methods)]
			var f cutoverFigure
			switch method {
			case "sequential", "parallel":
				f = bl.direct(method, method == "parallel", cur, other())
			case "limit":
				var took []time.Duration
				if backend == lab.BackendOVS {
					f, took = bl.limitOVS(cur, other())
				} else {
					f, took = bl.limitKernel(cur, other())
				}
				for k, d := range took {
					timings = append(timings, nodeTiming{Backend: backend, Method: "limit", Round: r + 1, Node: bl.nodes[k], WriteToEffectMS: benchresult.Millis(d)})
				}
			case "cutover":
				var rep *coordinatorv1.Report
				f, rep = bl.coordctl("cutover", "--port", strconv.Itoa(other()))
				cur = other()
				for _, t := range nodeTimings(rep) {
					t.Backend, t.Round = backend, r+1
					timings = append(timings, t)
				}
			case "staged":
				f, _ = bl.coordctl("staged", stagedArgs(other())...)
				cur = other()
			}
			f.IdleLost = bl.base.IdleLost
			printFigure(f, false)
			rows = append(rows, roundFigure{Round: r + 1, Position: pos, cutoverFigure: f})
		}
		for _, row := range rows {
			if row.Round == r+1 && row.Method == "limit" {
				for k := range rows {
					if rows[k].Round == r+1 && rows[k].Method == "cutover" {
						rows[k].LossVsLimit = float64(rows[k].Lost+1) / float64(row.Lost+1)
					}
				}
			}
		}
	}
	return rows, timings
}

// nodeTimings reads where each node's time went out of a cutover's report.
func nodeTimings(rep *coordinatorv1.Report) []nodeTiming {
	at := rep.GetCommitUnixNano()
	ms := func(d int64) float64 { return benchresult.Millis(time.Duration(d)) }
	var ts []nodeTiming
	for _, nr := range rep.GetNodes() {
		woke, w, e := nr.GetAppliedUnixNano(), nr.GetWrittenUnixNano(), nr.GetEffectiveUnixNano()
		if woke == 0 || w == 0 || e == 0 {
			continue
		}
		t := nodeTiming{Method: "cutover", Node: nr.GetNode(),
			WakeLateMS: ms(woke - at), WakeToWriteMS: ms(w - woke), WriteToEffectMS: ms(e - w), EffectMS: ms(e - at)}
		if rcv := nr.GetCommitReceivedUnixNano(); rcv != 0 {
			t.MarginMS = ms(at - rcv)
		}
		if a := nr.GetApplyToAnswerNanos(); a != 0 {
			t.EffectToAnswerMS = ms(a - (e - woke))
		}
		ts = append(ts, t)
	}
	return ts
}

func summarizeRounds(rows []roundFigure) []methodSummary {
	var out []methodSummary
	for _, r := range rows {
		if slices.ContainsFunc(out, func(s methodSummary) bool { return s.Backend == r.Backend && s.Method == r.Method }) {
			continue
		}
		var lost, sent, maxPair, gap, spread, write, effect, wall, idle, vs []float64
		for _, x := range rows {
			if x.Backend != r.Backend || x.Method != r.Method {
				continue
			}
			lost, sent, maxPair = append(lost, float64(x.Lost)), append(sent, float64(x.Sent)), append(maxPair, float64(x.MaxPairLost))
			gap, spread, wall = append(gap, x.LongestGapMS), append(spread, x.SpreadMS), append(wall, x.WallMS)
			write, effect, idle = append(write, x.WriteSpreadMS), append(effect, x.EffectSpreadMS), append(idle, float64(x.IdleLost))
			if x.LossVsLimit > 0 {
				vs = append(vs, x.LossVsLimit)
			}
		}
		s := methodSummary{Backend: r.Backend, Nodes: r.Nodes, Method: r.Method, Rounds: len(lost),
			Lost: statOf(lost), Sent: statOf(sent), MaxPairLost: statOf(maxPair), LongestGapMS: statOf(gap),
			WallMS: statOf(wall), IdleLostPerS: statOf(idle), LossVsLimit: statOf(vs)}
		if r.Method != "staged" {
			s.CommitSpreadMS = statOf(spread)
		}
		if r.Method == "cutover" || r.Method == "limit" {
			s.WriteSpreadMS, s.EffectSpreadMS = statOf(write), statOf(effect)
		}
		out = append(out, s)
	}
	return out
}

func breakDown(ts []nodeTiming) []effectBreakdown {
	type key struct{ backend, method string }
	var keys []key
	for _, t := range ts {
		if k := (key{t.Backend, t.Method}); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	var out []effectBreakdown
	for _, k := range keys {
		var late, w, e, ans []float64
		byRound := map[int][]nodeTiming{}
		var rounds []int
		for _, t := range ts {
			if t.Backend != k.backend || t.Method != k.method {
				continue
			}
			late, w, e = append(late, t.WakeLateMS), append(w, t.WakeToWriteMS), append(e, t.WriteToEffectMS)
			if t.EffectToAnswerMS != 0 {
				ans = append(ans, t.EffectToAnswerMS)
			}
			if _, ok := byRound[t.Round]; !ok {
				rounds = append(rounds, t.Round)
			}
			byRound[t.Round] = append(byRound[t.Round], t)
		}
		bd := effectBreakdown{Backend: k.backend, Method: k.method, WakeLateMS: statOf(late), WakeToWriteMS: statOf(w), WriteToEffectMS: statOf(e), EffectToAnswerMS: statOf(ans)}
		var sLate, sW, sE, sEff, dLate, dW, dE []float64
		spreadBy := func(nts []nodeTiming, f func(nodeTiming) float64) float64 {
			lo, hi := f(nts[0]), f(nts[0])
			for _, t := range nts {
				lo, hi = min(lo, f(t)), max(hi, f(t))
			}
			return hi - lo
		}
		for _, r := range rounds {
			nts := byRound[r]
			sE = append(sE, spreadBy(nts, func(t nodeTiming) float64 { return t.WriteToEffectMS }))
			if k.method != "cutover" {
				continue
			}
			sLate = append(sLate, spreadBy(nts, func(t nodeTiming) float64 { return t.WakeLateMS }))
			sW = append(sW, spreadBy(nts, func(t nodeTiming) float64 { return t.WakeToWriteMS }))
			sEff = append(sEff, spreadBy(nts, func(t nodeTiming) float64 { return t.EffectMS }))
			first, last := nts[0], nts[0]
			for _, t := range nts {
				if t.EffectMS < first.EffectMS {
					first = t
				}
				if t.EffectMS > last.EffectMS {
					last = t
				}
			}
			dLate = append(dLate, last.WakeLateMS-first.WakeLateMS)
			dW = append(dW, last.WakeToWriteMS-first.WakeToWriteMS)
			dE = append(dE, last.WriteToEffectMS-first.WriteToEffectMS)
		}
		bd.WriteToEffectSpreadMS = statOf(sE)
		bd.WakeLateSpreadMS, bd.WakeToWriteSpreadMS, bd.EffectSpreadMS = statOf(sLate), statOf(sW), statOf(sEff)
		bd.LastFirstWakeMS, bd.LastFirstWakeToWriteMS, bd.LastFirstWriteToEffectMS = statOf(dLate), statOf(dW), statOf(dE)
		out = append(out, bd)
	}
	return out
}

func lateBudget() string {
	if lb := envDur("COT_LAB_BENCH_LATE_BUDGET", 0); lb > 0 {
		return fmt.Sprintf("a lateness budget of %s + %s", lb, lb/3)
	}
	return "the lab's lateness budget (600 + 400 ms)"
}

// writeRoundsResults writes results/<name>.json and the two tables
// between the <!-- <name>:begin/end --> and <!-- <name>-effect:begin/end
// --> markers in docs/benchmarks.md, as writeCutoverResults does.
func writeRoundsResults(b *testing.B, res roundsResults) {
	name := envOr("COT_LAB_BENCH_NAME", "lab_cutover_n8")
	if !regexp.MustCompile(`^[a-z0-9_]+$`).MatchString(name) {
		b.Fatalf("COT_LAB_BENCH_NAME %q: want [a-z0-9_]+ (a file name and a doc marker)", name)
	}
	benchresult.Save(b, name+".json", res)
	marker := strings.ReplaceAll(name, "_", "-")
	load, _ := os.ReadFile("/proc/loadavg")
	r := func(s stat, prec int) string {
		if s.N == 0 {
			return ""
		}
		f := "%." + strconv.Itoa(prec) + "f"
		return fmt.Sprintf(f+" ("+f+"–"+f+")", s.Median, s.Min, s.Max)
	}
	var t strings.Builder
	fmt.Fprintf(&t, "`results/%s.json`: %d CPUs, load average at the end %s, %s; %d rounds, median (min–max) over them.\n\n",
		name, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "), res.LateBudgetNote, res.Rounds)
	t.WriteString("| backend | N | method | probes | lost | max lost/pair | longest gap (ms) | commit spread (ms) | write spread (ms) | effect spread (ms) | idle lost/s |\n")
	t.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Summary {
		probes := ""
		for _, row := range res.Rows {
			if row.Backend == s.Backend {
				probes = fmt.Sprintf("%.0fms × %d peers", row.IntervalMS, row.ProbePeers)
				break
			}
		}
		fmt.Fprintf(&t, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Backend, s.Nodes, s.Method, probes,
			r(s.Lost, 0), r(s.MaxPairLost, 0), r(s.LongestGapMS, 1), r(s.CommitSpreadMS, 2), r(s.WriteSpreadMS, 2), r(s.EffectSpreadMS, 2), r(s.IdleLostPerS, 0))
	}
	tables := map[string]string{marker: t.String()}

	var e strings.Builder
	fmt.Fprintf(&e, "`results/%s.json` (`effect_breakdown`, per node in `node_timings`): milliseconds, median (min–max).\n\n", name)
	e.WriteString("| backend | method | wake after the instant | wake → write | write → effect | effect → answer | spread over nodes: wake / wake → write / write → effect / effect | last − first confirmed: Δwake / Δ(wake → write) / Δ(write → effect) |\n")
	e.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, x := range res.EffectSpread {
		spreads, deltas := r(x.WriteToEffectSpreadMS, 2), ""
		if x.Method == "cutover" {
			spreads = strings.Join([]string{r(x.WakeLateSpreadMS, 2), r(x.WakeToWriteSpreadMS, 2), r(x.WriteToEffectSpreadMS, 2), r(x.EffectSpreadMS, 2)}, " / ")
			deltas = strings.Join([]string{r(x.LastFirstWakeMS, 2), r(x.LastFirstWakeToWriteMS, 2), r(x.LastFirstWriteToEffectMS, 2)}, " / ")
		}
		late, w2w, ans := r(x.WakeLateMS, 3), r(x.WakeToWriteMS, 3), r(x.EffectToAnswerMS, 2)
		if x.Method == "limit" {
			late, w2w, spreads = "", "", "write → effect "+spreads
		}
		fmt.Fprintf(&e, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Backend, x.Method, late, w2w, r(x.WriteToEffectMS, 2), ans, spreads, deltas)
	}
	tables[marker+"-effect"] = e.String()

	p := "../../docs/benchmarks.md"
	doc, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	for m, body := range tables {
		re := regexp.MustCompile(`(?s)<!-- ` + m + `:begin -->.*<!-- ` + m + `:end -->`)
		if !re.Match(doc) {
			b.Logf("docs/benchmarks.md has no %s markers; table:\n%s", m, body)
			continue
		}
		doc = re.ReplaceAll(doc, []byte(strings.ReplaceAll("<!-- "+m+":begin -->\n"+body+"<!-- "+m+":end -->", "$", "$$")))
	}
	if err := os.WriteFile(p, doc, 0o644); err != nil {
		b.Fatal(err)
	}
}
