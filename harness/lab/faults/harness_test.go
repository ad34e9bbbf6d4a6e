package faults_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// Short timeouts so each fault resolves in seconds: a step (one RPC round)
// may take 1.5 s, an agent reverts by itself 5 s after an unconfirmed
// commit and aborts a prepare nobody commits after 6 s.
const (
	stepTimeout    = 1500 * time.Millisecond
	deadman        = 5 * time.Second
	prepareTimeout = 6 * time.Second
	consistentIn   = 10 * time.Second // how soon the overlay must be consistent again
	fromPort       = 4789
	toPort         = 4889
)

var privBins = []string{"ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl", "iptables", "iptables-save", "nft", "nsenter", "go"}

func TestMain(m *testing.M) {
	code := m.Run()
	labtest.Cleanup()
	os.Exit(code)
}

// bins builds agent, coordinator and coordctl from this tree once per test
// binary, so no test runs stale binaries from bin/.
func bins(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("COT_FAULTS_BIN"); d != "" {
		return d // prebuilt agent, coordinator, coordctl (debugging)
	}
	return labtest.Binaries(t)
}

// env is one test's lab and what the test measured about it.
type env struct {
	t    *testing.T
	l    *lab.Lab
	bin  string
	ctx  context.Context
	base snapshot // before any operation

	mu      sync.Mutex
	lastBad time.Time // last port sample that found the nodes disagreeing
	sampled bool
}

// sample reads every node's port from OVS every ~50 ms from now until
// the test ends and remembers the last instant they disagreed, so the
// time to consistency is measured, not guessed from when a test looked.
func (e *env) sample() {
	e.mu.Lock()
	if e.sampled {
		e.mu.Unlock()
		return
	}
	e.sampled = true
	e.mu.Unlock()
	stop := make(chan struct{})
	done := make(chan struct{})
	e.t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			seen := map[int]bool{}
			for _, n := range nodes {
				if p, err := e.l.Port(e.ctx, n); err == nil {
					seen[p] = true
				}
			}
			if len(seen) > 1 {
				e.mu.Lock()
				e.lastBad = time.Now()
				e.mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

// newEnv brings up a 3-node OVS lab with the real processes and short
// timeouts. The lab name is f<tag><random>, unique per run.
func newEnv(t *testing.T, tag string, mod ...func(*lab.Config)) *env {
	t.Helper()
	testenv.RequirePrivileged(t, privBins...)
	bin := bins(t)
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	name := "f" + tag + hex.EncodeToString(rnd[:])
	if len(name) > 12 {
		t.Fatalf("lab name %q too long: shorten the tag", name)
	}
	cfg := lab.Config{
		Name: name, Nodes: 3, Backend: lab.BackendOVS, StartProcesses: true,
		AgentBin: filepath.Join(bin, "agent"), CoordinatorBin: filepath.Join(bin, "coordinator"),
		ExtraAgentArgs: []string{"--prepare-timeout", prepareTimeout.String(), "--deadman", deadman.String(),
			"--call-timeout", "5s", "--backend-retry", "500ms"},
		ExtraCoordinatorArgs: []string{"--step-timeout", stepTimeout.String(), "--deadman", deadman.String(),
			"--rollback-attempts", "3"},
	}
	for _, f := range mod {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	start := time.Now()
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, l)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := l.Down(dctx); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	t.Logf("lab %s up in %s", name, time.Since(start).Round(time.Millisecond))
	e := &env{t: t, l: l, bin: bin, ctx: ctx}
	e.waitReady()
	e.base = e.snap()
	e.observeI2()
	return e
}

// observeI2 watches I2 through whatever the test does next, on either
// backend (lab.ObserveI2: the nodes' own firewall, OVSDB and kernel,
// never the product's records), and asserts it when the test ends, before
// the lab goes down. Every flip to toPort must find every node's rule for
// it open at that instant; a node that never flips is fine (the fault
// aborted the operation, or it was rolled back before that node flipped),
// but when every node ends on toPort each must have been seen flipping,
// or the observer missed what it is there to see, and when every
// operation aborted none may have flipped at all. The fault suite runs
// the atomic strategy only (the lab's default, and the kernel tests ask
// for it), so the atomic rule applies.
func (e *env) observeI2() {
	e.t.Helper()
	obs, err := e.l.ObserveI2(e.ctx, toPort)
	if err != nil {
		e.t.Fatalf("I2 observer: %v", err)
	}
	e.t.Cleanup(func() {
		// The monitors push; let the last events land.
		time.Sleep(200 * time.Millisecond)
		obs.Stop()
		ended := 0
		for _, n := range nodes {
			if p, err := e.l.Port(e.ctx, n); err == nil && p == toPort {
				ended++
			}
		}
		rules := lab.I2Rules{Partial: ended < len(nodes)}
		if err := obs.CheckWith(rules); err != nil {
			e.t.Errorf("the independent I2 observer (every node on %d at the end: %v): %v", toPort, !rules.Partial, err)
			return
		}
		// An abort comes before the commit: no node may have flipped at
		// all, however briefly.
		if out := e.outcomes(); len(out) > 0 && !slices.ContainsFunc(out, func(o string) bool { return o != "aborted" }) {
			if f := obs.Flipped(); len(f) > 0 {
				e.t.Errorf("the independent I2 observer: every operation aborted, yet %v flipped to %d:\n%v", f, toPort, obs.Events())
				return
			}
		}
		e.t.Logf("I2 held: %s (flipped: %v)", obs.Summary(), obs.Flipped())
	})
}

func dumpLogs(t *testing.T, l *lab.Lab) {
	for _, f := range []string{filepath.Join(l.Dir(), "coordinator.log"), filepath.Join(l.Dir(), "n1", "agent.log"),
		filepath.Join(l.Dir(), "n2", "agent.log"), filepath.Join(l.Dir(), "n3", "agent.log")} {
		b, _ := os.ReadFile(f)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("--- %s (tail) ---\n%s", f, b)
	}
}

// waitReady waits until every agent is ready (backend up, /readyz ok).
func (e *env) waitReady() {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := e.l.Status(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		var bad []string
		for _, n := range st.Nodes {
			if n.AgentReady != "ok" {
				bad = append(bad, n.Name+": "+n.AgentReady)
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("agents not ready: %s", strings.Join(bad, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var nodes = []string{"n1", "n2", "n3"}

// result of one coordctl run: out is stdout and stderr together, stdout
// alone is what -o json parses.
type result struct {
	out, stdout string
	code        int
	took        time.Duration
}

// coordctl runs coordctl in the hub against the lab's coordinator.
func (e *env) coordctl(args ...string) result {
	e.t.Helper()
	cmd, err := e.l.CoordctlCommand(e.ctx, filepath.Join(e.bin, "coordctl"), args...)
	if err != nil {
		e.t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	r := result{out: stdout.String() + stderr.String(), stdout: stdout.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		e.t.Fatalf("coordctl %v: %v", args, err)
	}
	return r
}

// coordctlBG starts coordctl in the background; wait returns its result.
func (e *env) coordctlBG(args ...string) (wait func() result) {
	e.t.Helper()
	cmd, err := e.l.CoordctlCommand(e.ctx, filepath.Join(e.bin, "coordctl"), args...)
	if err != nil {
		e.t.Fatal(err)
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() {
		err := cmd.Wait()
		r := result{out: buf.String(), took: time.Since(start)}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			r.code = ee.ExitCode()
		} else if err != nil {
			r.code = -1
		}
		done <- r
	}()
	e.sample()
	var once sync.Once
	var r result
	return func() result {
		once.Do(func() { r = <-done })
		return r
	}
}

// snapshot is every node's dataplane and records, read from the systems
// themselves: OVS (ovs-vsctl, ovs-ofctl), iptables-save in each node
// namespace, the agents' state files and the coordinator's journal, byte
// for byte.
type snapshot struct {
	Ports   map[string]int
	PortErr map[string]string
	IPT     map[string]string
	Flows   map[string]string
	State   map[string]string // operation.json, raw
	Journal map[string]string // file name → content
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

func (e *env) snap() snapshot {
	e.t.Helper()
	s := snapshot{Ports: map[string]int{}, PortErr: map[string]string{}, IPT: map[string]string{}, Flows: map[string]string{},
		State: map[string]string{}, Journal: map[string]string{}}
	for _, n := range nodes {
		if p, err := e.l.Port(e.ctx, n); err != nil {
			s.PortErr[n] = err.Error()
		} else {
			s.Ports[n] = p
		}
		s.IPT[n] = e.iptables(n)
		s.Flows[n] = e.flows(n)
		node, _ := e.l.Node(n)
		b, err := os.ReadFile(filepath.Join(node.StateDir, "operation.json"))
		if err == nil {
			s.State[n] = string(b)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(e.l.Dir(), "coordinator", "operations"))
	for _, de := range ents {
		b, _ := os.ReadFile(filepath.Join(e.l.Dir(), "coordinator", "operations", de.Name()))
		s.Journal[de.Name()] = string(b)
	}
	return s
}

// iptables is iptables-save of node's namespace without comments and
// packet counters.
func (e *env) iptables(node string) string {
	out, err := e.l.Exec(e.ctx, node, "iptables-save")
	if err != nil {
		e.t.Fatalf("iptables-save on %s: %v", node, err)
	}
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keep = append(keep, counters.ReplaceAllString(line, "[]"))
	}
	return strings.Join(keep, "\n")
}

// flows is br0's OpenFlow table without statistics, sorted.
func (e *env) flows(node string) string {
	if e.l.OVS(node) == nil {
		return "" // kernel-vxlan: no OVS
	}
	out, err := e.l.OVS(node).Ofctl(e.ctx, "-O", "OpenFlow13", "--no-stats", "dump-flows", "br0")
	if err != nil {
		return "error: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// rules are the -A lines of an iptables-save text.
func rules(ipt string) []string {
	var out []string
	for _, l := range strings.Split(ipt, "\n") {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out
}

// agentRecord is the part of an agent's operation.json the tests read.
type agentRecord struct {
	ID         string `json:"id"`
	Phase      string `json:"phase"`
	FromPort   int    `json:"from_port"`
	ToPort     int    `json:"to_port"`
	Applied    string `json:"applied"`
	RevertedBy string `json:"reverted_by"`
	Error      string `json:"error"`
}

func (e *env) record(node string) agentRecord {
	n, _ := e.l.Node(node)
	var r agentRecord
	b, err := os.ReadFile(filepath.Join(n.StateDir, "operation.json"))
	if err == nil {
		_ = json.Unmarshal(b, &r)
	}
	return r
}

// journalRec is the part of a coordinator journal record the tests read.
type journalRec struct {
	ID         string          `json:"id"`
	Step       string          `json:"step"`
	CommitSent bool            `json:"commit_sent"`
	Outcome    string          `json:"outcome"`
	Report     json.RawMessage `json:"report"`
}

// outcomes are the outcomes of every operation the coordinator
// journaled, in no particular order.
func (e *env) outcomes() []string {
	dir := filepath.Join(e.l.Dir(), "coordinator", "operations")
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, de := range ents {
		if strings.HasPrefix(de.Name(), ".") || !strings.HasSuffix(de.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		var r journalRec
		if err == nil && json.Unmarshal(b, &r) == nil {
			out = append(out, r.Outcome)
		}
	}
	return out
}

// journal returns the newest journal record ("" ID when none).
func (e *env) journal() journalRec {
	dir := filepath.Join(e.l.Dir(), "coordinator", "operations")
	ents, _ := os.ReadDir(dir)
	var best journalRec
	var bestT time.Time
	for _, de := range ents {
		if strings.HasPrefix(de.Name(), ".") || !strings.HasSuffix(de.Name(), ".json") {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			continue
		}
		var r journalRec
		if json.Unmarshal(b, &r) == nil && !info.ModTime().Before(bestT) {
			best, bestT = r, info.ModTime()
		}
	}
	return best
}

// withCommitLead runs the coordinator with a commit lead of at least d
// (--commit-lead-min): time enough between the Commit reaching the agents
// and the instant for a test to act before the instant on a loaded
// machine, where the default lead is tens of milliseconds.
func withCommitLead(d time.Duration) func(*lab.Config) {
	return func(c *lab.Config) {
		c.ExtraCoordinatorArgs = append(c.ExtraCoordinatorArgs, "--commit-lead-min", d.String())
	}
}

// everyAgent says whether ok holds for every node's agent record.
func (e *env) everyAgent(ok func(agentRecord) bool) bool {
	for _, n := range nodes {
		if !ok(e.record(n)) {
			return false
		}
	}
	return true
}

// freezeAtCommit waits until every agent holds its Commit, the instant
// still the commit lead away (the coordinator runs withCommitLead), and
// freezes the coordinator: the agents apply at the instant on their own,
// and nothing moves on to verify or confirm until the returned thaw (safe
// to call again; the test's cleanup calls it too).
func (e *env) freezeAtCommit() (thaw func()) {
	e.t.Helper()
	if !spinUntil(15*time.Second, func() bool { return e.everyAgent(func(r agentRecord) bool { return r.Phase == "COMMITTED" }) }) {
		e.t.Fatalf("not every agent recorded its Commit: n1 %+v", e.record("n1"))
	}
	coord := e.proc("hub")
	if err := lab.Freeze(coord); err != nil {
		e.t.Fatal(err)
	}
	thaw = sync.OnceFunc(func() {
		if err := lab.Thaw(coord); err != nil {
			e.t.Error(err)
		}
	})
	e.t.Cleanup(thaw)
	return thaw
}

// spinUntil polls cond as fast as it can (the hooks that land a fault in
// a phase must act within microseconds of the transition's first durable
// trace) until it holds or timeout passes.
func spinUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
	}
	return false
}

// waitUntil polls cond every 20 ms.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consistent waits until every node reads back the same port from OVS,
// that port being want (0: any), and returns it with the time to
// consistency from since (measured by the sampler when it runs). It fails
// the test after consistentIn, also when a node's port cannot be read: a
// node the check cannot see is not a consistent node (I1). Call it once
// the fault has played out (operation ended, agents settled): before,
// nodes may agree only because nothing has flipped yet.
func (e *env) consistent(since time.Time, want int) (int, time.Duration) {
	e.t.Helper()
	var port int
	var why error
	ok := waitUntil(consistentIn-time.Since(since), func() bool {
		ports, errs := map[string]int{}, map[string]error{}
		for _, n := range nodes {
			if p, err := e.l.Port(e.ctx, n); err != nil {
				errs[n] = err
			} else {
				ports[n] = p
			}
		}
		port, why = agreedPort(nodes, ports, errs, want)
		return why == nil
	})
	took := time.Since(since)
	if !ok {
		e.t.Fatalf("ports not consistent within %s: %v", consistentIn, why)
	}
	// With the sampler running, the time to consistency is from the fault
	// to just after the last sample that saw the nodes disagree (0: they
	// never did), however late the test looked.
	e.mu.Lock()
	if e.sampled {
		took = 0
		if e.lastBad.After(since) {
			took = e.lastBad.Sub(since) + 50*time.Millisecond
		}
	}
	e.mu.Unlock()
	if took > consistentIn {
		e.t.Errorf("nodes disagreed until %s after the fault, more than %s", took, consistentIn)
	}
	return port, took
}

// agreedPort is consistent's verdict on one reading: the port every one
// of nodes reads back, which must be want (0: any). A node whose port
// could not be read (errs), or that has no reading, is a failure, never
// skipped.
func agreedPort(nodes []string, ports map[string]int, errs map[string]error, want int) (int, error) {
	var bad []string
	seen := map[int][]string{}
	for _, n := range nodes {
		if err, ok := errs[n]; ok {
			bad = append(bad, fmt.Sprintf("%s: port unreadable: %v", n, err))
			continue
		}
		p, ok := ports[n]
		if !ok {
			bad = append(bad, n+": no reading")
			continue
		}
		seen[p] = append(seen[p], n)
	}
	if len(bad) > 0 {
		return 0, errors.New(strings.Join(bad, "; "))
	}
	if len(seen) != 1 {
		return 0, fmt.Errorf("nodes disagree: %v", seen)
	}
	for p := range seen {
		if want != 0 && p != want {
			return 0, fmt.Errorf("every node on %d, want %d", p, want)
		}
		return p, nil
	}
	return 0, errors.New("no nodes")
}

// assertClean checks there is no orphan firewall rule or flow, reading
// each node's iptables-save and br0 flows: after an operation that left
// the port as it was, both are the baseline's exactly (no rule or flow of
// the new port left: abort and rollback undid prepare); after a successful
// one they are the baseline with the old port replaced by the new one
// wherever it appeared (the lab's OS_FIREWALL_ALLOW rule, and whatever a
// profile owns: the SDN's chains, its drop flow), exactly: an old-port
// rule or flow still there is a missing Finalize, an extra one an orphan.
func (e *env) assertClean(port int) {
	e.t.Helper()
	for _, p := range cleanProblems(e.base, e.snap(), fromPort, port) {
		e.t.Error(p)
	}
}

var portRE = regexp.MustCompile(`(--dport |tp_dst=|dst_port=)(\d+)\b`)

// movedTo is text with every port match of from replaced by to.
func movedTo(text string, from, to int) string {
	return portRE.ReplaceAllStringFunc(text, func(m string) string {
		sub := portRE.FindStringSubmatch(m)
		if sub[2] == strconv.Itoa(from) {
			return sub[1] + strconv.Itoa(to)
		}
		return m
	})
}

// cleanProblems is assertClean's verdict: what differs between now and
// base moved from from to port, per node, as rule and flow sets.
func cleanProblems(base, now snapshot, from, port int) []string {
	var out []string
	for _, n := range nodes {
		wantRules := rules(movedTo(base.IPT[n], from, port))
		gotRules := rules(now.IPT[n])
		if extra, missing := setDiff(gotRules, wantRules); len(extra)+len(missing) > 0 {
			out = append(out, fmt.Sprintf("%s: firewall after the port went %d→%d: extra (orphan, or an old-port rule Finalize did not remove) %q; missing %q",
				n, from, port, extra, missing))
		}
		wantFlows := strings.Split(movedTo(base.Flows[n], from, port), "\n")
		gotFlows := strings.Split(now.Flows[n], "\n")
		if extra, missing := setDiff(gotFlows, wantFlows); len(extra)+len(missing) > 0 {
			out = append(out, fmt.Sprintf("%s: br0 flows after the port went %d→%d: extra %q; missing %q", n, from, port, extra, missing))
		}
	}
	return out
}

// setDiff returns the lines of got not in want and of want not in got
// (as multisets: a duplicated rule counts).
func setDiff(got, want []string) (extra, missing []string) {
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, g := range got {
		if count[g] > 0 {
			count[g]--
			continue
		}
		extra = append(extra, g)
	}
	for _, w := range want {
		if count[w] > 0 {
			missing = append(missing, w)
			count[w]--
		}
	}
	return extra, missing
}

// agentPhasesFor are the agent record phases consistent with a journal
// outcome, for an agent that saw the operation.
var agentPhasesFor = map[string][]string{
	"aborted":     {"ABORTED"},
	"rolled-back": {"REVERTED", "ABORTED"},
	"succeeded":   {"FINALIZED", "CONFIRMED"},
	"failed":      {"ABORTED", "REVERTED", "FAILED", "PREPARED", "COMMITTED"},
}

// assertAgree checks that the coordinator's journal ended, that each
// agent's record (state file) agrees with its outcome and with the port
// OVS reads back, and that `coordctl status -o json` reports the same.
// It returns the journal's outcome.
func (e *env) assertAgree(port int) string {
	e.t.Helper()
	var j journalRec
	if !waitUntil(consistentIn, func() bool { j = e.journal(); return j.Outcome != "" && j.Outcome != "pending" }) {
		e.t.Fatalf("journal did not end: %+v", j)
	}
	for _, n := range nodes {
		r := e.record(n)
		if r.ID != j.ID {
			// An agent that never saw the operation: only fine when the
			// port never moved.
			if port != fromPort {
				e.t.Errorf("%s: record is for %q, journal for %q, and the port moved", n, r.ID, j.ID)
			}
			continue
		}
		if !slices.Contains(agentPhasesFor[j.Outcome], r.Phase) {
			e.t.Errorf("%s: agent record %s (by %s: %s) does not agree with journal outcome %s", n, r.Phase, r.RevertedBy, r.Error, j.Outcome)
		}
	}
	want := map[string]int{"aborted": fromPort, "rolled-back": fromPort, "succeeded": toPort}
	if w, ok := want[j.Outcome]; ok && w != port {
		e.t.Errorf("journal says %s but the nodes are on %d", j.Outcome, port)
	}
	st := e.coordctl("status", "-o", "json")
	var rep struct {
		State string `json:"state"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(st.stdout), &rep); err != nil {
		e.t.Errorf("coordctl status -o json: %v\n%s", err, st.out)
	}
	wantState := map[string]string{"aborted": "OPERATION_STATE_ABORTED", "rolled-back": "OPERATION_STATE_ROLLED_BACK",
		"succeeded": "OPERATION_STATE_SUCCEEDED", "failed": "OPERATION_STATE_FAILED"}[j.Outcome]
	if rep.State != wantState {
		e.t.Errorf("coordctl status says %s, journal %s", rep.State, j.Outcome)
	}
	e.t.Logf("journal %s: %s (step %s); report: %s %s", j.ID, j.Outcome, j.Step, rep.State, rep.Error)
	return j.Outcome
}

// stateOf reads node's agent record phase.
func (e *env) phase(node string) string { return e.record(node).Phase }

// fact is one row of the fault table, logged in a fixed form that
// docs/faults.md is compiled from.
func (e *env) fact(fault, phase, expected, observed string, took time.Duration) {
	e.t.Logf("FAULT | %s | %s | %s | %s | %s", fault, phase, expected, observed, took.Round(time.Millisecond))
}
