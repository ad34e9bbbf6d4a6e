package lab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// The shipped alert rules and the job names the shipped PodMonitors give
// their targets in Prometheus Operator (<namespace>/<podmonitor>): the
// rules select on them, so the lab's scrape config uses the same.
const (
	shippedRules   = "../../deploy/components/monitoring/prometheusrule.yaml"
	agentJob       = "cutover/cutover-agent"
	coordinatorJob = "cutover/cutover-coordinator"
	// promFor replaces every rule's `for:` (2m to 70m as shipped) so an
	// alert goes pending→firing within the test; the expressions, labels
	// and annotations are the shipped ones, unchanged.
	promFor = "3s"
)

// nsHTTPClient is an HTTP client whose connections are made from inside
// network namespace ns: a socket belongs to the namespace of the thread
// that creates it (netns.Do locks one), and the connection can then be
// used from any goroutine. No keep-alives: every request dials anew, so
// no pooled connection outlives the namespace.
func nsHTTPClient(ns string) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
}

// promServer is a real Prometheus running in a lab's hub namespace, where
// every management address (agents' and coordinator's /metrics) is
// reachable, listening on the hub's loopback.
type promServer struct {
	t    *testing.T
	c    *http.Client
	base string // http://127.0.0.1:9090
	log  string
}

// promConfig is prometheus.yml: 1 s scrapes and rule evaluations, one
// static target per agent labelled with its node (as the PodMonitor's
// relabeling does from the pod's node name) and the coordinator.
func promConfig(l *lab.Lab, rules string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n")
	fmt.Fprintf(&b, "rule_files: [%q]\n", rules)
	fmt.Fprintf(&b, "scrape_configs:\n- job_name: %q\n  static_configs:\n", agentJob)
	for _, n := range l.Nodes() {
		fmt.Fprintf(&b, "  - targets: [%q]\n    labels: {node: %q}\n", n.Metrics, n.Name)
	}
	fmt.Fprintf(&b, "- job_name: %q\n  static_configs:\n  - targets: [%q]\n    labels: {node: hub}\n",
		coordinatorJob, net.JoinHostPort(lab.HubMgmt.String(), strconv.Itoa(lab.CoordinatorMetricsPort)))
	return b.String()
}

// testRules writes the shipped PrometheusRule's spec as a Prometheus rule
// file, every `for:` replaced by promFor, and returns its path.
func testRules(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(shippedRules)
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Name  string           `json:"name"`
				Rules []map[string]any `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatalf("%s: %v", shippedRules, err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		t.Fatalf("%s: kind %q with %d groups, want a PrometheusRule with rules", shippedRules, pr.Kind, len(pr.Spec.Groups))
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if _, ok := r["for"]; ok {
				r["for"] = promFor
			}
		}
	}
	out, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", path, err, out)
	}
	return path
}

// startPrometheus starts the real prometheus in l's hub namespace and stops
// it by PID in t.Cleanup (registered after the lab's, so it runs before
// the lab's Down, which would otherwise find it as a stray in the hub).
func startPrometheus(t *testing.T, l *lab.Lab) *promServer {
	t.Helper()
	// Outside the lab dir: Down removes that, and the TSDB should be
	// readable after a failure until the test's own cleanup.
	dir := t.TempDir()
	rules := testRules(t, dir)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(promConfig(l, rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	logPath := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logf.Close() }() // the child holds its own copy
	addr := "127.0.0.1:9090"            // the hub's own loopback: one per lab
	cmd := netns.Command(lab.HubNetns(l.Name()), "prometheus",
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", strings.Join(cmd.Args, " "), err)
	}
	// `ip netns exec` execs in place: this PID is prometheus itself.
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("prometheus (pid %d) still running 10s after SIGTERM; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	t.Logf("prometheus pid %d in %s on %s", pid, lab.HubNetns(l.Name()), addr)
	return &promServer{t: t, c: nsHTTPClient(lab.HubNetns(l.Name())), base: "http://" + addr, log: logPath}
}

// ready returns nil once Prometheus answers /-/ready with 200 (TSDB
// opened, config and rules loaded).
func (p *promServer) ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/-/ready", nil)
	if err != nil {
		return err
	}
	resp, err := p.c.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/-/ready: %s", resp.Status)
	}
	return nil
}

// api GETs /api/v1/<path> and decodes its data into out.
func (p *promServer) api(ctx context.Context, path string, q url.Values, out any) error {
	u := p.base + "/api/v1/" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := p.c.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("GET %s: %s: %w: %.200s", u, resp.Status, err, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// sample is one element of an instant vector.
type sample struct {
	Metric map[string]string
	Value  float64
}

// query runs an instant query that must return a vector.
func (p *promServer) query(ctx context.Context, q string) ([]sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.api(ctx, "query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", q, data.ResultType)
	}
	out := make([]sample, 0, len(data.Result))
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", q, r.Value[1], err)
		}
		out = append(out, sample{r.Metric, v})
	}
	return out, nil
}

// byNode queries q and returns its values by the node label.
func (p *promServer) byNode(ctx context.Context, q string) (map[string]float64, error) {
	ss, err := p.query(ctx, q)
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, s := range ss {
		m[s.Metric["node"]] += s.Value
	}
	return m, nil
}

// eventually polls check every 250 ms until it returns nil or timeout
// passes, and returns the last error.
func eventually(ctx context.Context, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
	LastScrape time.Time         `json:"lastScrape"`
}

// targetsUp waits until Prometheus has scraped every one of want targets
// successfully, and returns them.
func (p *promServer) targetsUp(ctx context.Context, want int, timeout time.Duration) ([]promTarget, error) {
	var ts []promTarget
	err := eventually(ctx, timeout, func() error {
		var data struct {
			Active []promTarget `json:"activeTargets"`
		}
		if err := p.api(ctx, "targets", url.Values{"state": {"active"}}, &data); err != nil {
			return err
		}
		ts = data.Active
		var bad []string
		for _, t := range ts {
			if t.Health != "up" {
				bad = append(bad, fmt.Sprintf("%s %s %s", t.ScrapeURL, t.Health, t.LastError))
			}
		}
		if len(ts) != want || len(bad) > 0 {
			return fmt.Errorf("%d of %d targets, not up: %v", len(ts), want, bad)
		}
		return nil
	})
	return ts, err
}

type promRule struct {
	Name           string    `json:"name"`
	Query          string    `json:"query"`
	Type           string    `json:"type"`
	State          string    `json:"state"` // inactive, pending, firing
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

func (p *promServer) rules(ctx context.Context) ([]promRule, error) {
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api(ctx, "rules", url.Values{"type": {"alert"}}, &data); err != nil {
		return nil, err
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// rulesEvaluatedAfter waits until every alert rule has been evaluated
// (healthy) after t0 and returns them.
func (p *promServer) rulesEvaluatedAfter(ctx context.Context, t0 time.Time, timeout time.Duration) ([]promRule, error) {
	var rs []promRule
	err := eventually(ctx, timeout, func() error {
		var err error
		if rs, err = p.rules(ctx); err != nil {
			return err
		}
		if len(rs) == 0 {
			return errors.New("prometheus has loaded no alert rules")
		}
		for _, r := range rs {
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
			if !r.LastEvaluation.After(t0) {
				return fmt.Errorf("rule %s last evaluated %s, not after %s", r.Name, r.LastEvaluation, t0)
			}
		}
		return nil
	})
	return rs, err
}

func ruleStates(rs []promRule) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.Name+"="+r.State)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

// scrapeAndLint fetches url (from the hub) and runs the real `promtool
// check metrics` on it, as an operator would on a node. It returns the
// body's size and its number of samples.
func scrapeAndLint(t *testing.T, c *http.Client, u string) (size, samples int) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", u, resp.Status, err)
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s: %v\n%s", u, err, out)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			samples++
		}
	}
	return len(body), samples
}

// selectorRE finds the cutover_* vector selectors (with their label
// matchers) in an expression as Prometheus prints it back.
var selectorRE = regexp.MustCompile(`cutover_[a-z_]+(\{[^}]*\})?`)

// The lab seen by a real Prometheus (the Debian package CI installs) with
// the shipped alert rules loaded, as a cluster's Prometheus sees it
// through the shipped PodMonitors: 3 OVS nodes, the real agents and
// coordinator, probes on.
//
//   - promtool check metrics is clean on every agent's and the
//     coordinator's /metrics, read over the management network.
//   - Every target is up; every shipped alert rule loads and evaluates
//     healthy, and every cutover_* selector in it matches a live series (a
//     matcher on a label value the binaries never export is an alert that
//     can never fire).
//   - After `coordctl cutover --port 4889`: every agent's
//     cutover_agent_current_port is 4889, each agent's apply-duration
//     histogram counted the commit, the coordinator counted one succeeded
//     operation and its commit-spread gauge equals the spread in the
//     operation's report, and the probe counters of every ordered pair are
//     there and growing; no alert is pending or firing.
//   - One node moved back to 4789 with ovs-vsctl behind its agent's back
//     makes CutoverPortDrift fire (its `for:` shortened to promFor).
func TestPrometheusScrapesLab(t *testing.T) {
	testenv.RequirePrivileged(t, append(ovsBins, "prometheus", "promtool", "go")...)
	t.Parallel()
	bin := labtest.Binaries(t)
	cfg := newConfig(t, lab.BackendOVS, 3)
	cfg.StartProcesses = true
	cfg.AgentBin = filepath.Join(bin, "agent")
	cfg.CoordinatorBin = filepath.Join(bin, "coordinator")
	cfg.ProbeInterval = 50 * time.Millisecond // the mesh runs; no figures are measured here
	l := up(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes := l.Nodes()

	// promtool check metrics on what the binaries serve.
	hub := nsHTTPClient(lab.HubNetns(l.Name()))
	for _, n := range nodes {
		size, samples := scrapeAndLint(t, hub, "http://"+n.Metrics+"/metrics")
		t.Logf("agent %s /metrics: %d bytes, %d samples", n.Name, size, samples)
	}
	coordMetrics := "http://" + net.JoinHostPort(lab.HubMgmt.String(), strconv.Itoa(lab.CoordinatorMetricsPort)) + "/metrics"
	size, samples := scrapeAndLint(t, hub, coordMetrics)
	t.Logf("coordinator /metrics: %d bytes, %d samples", size, samples)

	p := startPrometheus(t, l)
	start := time.Now()
	if err := eventually(ctx, 30*time.Second, func() error { return p.ready(ctx) }); err != nil {
		t.Fatalf("prometheus not ready: %v", err)
	}
	t.Logf("prometheus ready %s after start", time.Since(start).Round(time.Millisecond))
	ts, err := p.targetsUp(ctx, len(nodes)+1, 30*time.Second)
	if err != nil {
		t.Fatalf("prometheus targets: %v", err)
	}
	t.Logf("all %d targets up %s after prometheus started", len(ts), time.Since(start).Round(time.Millisecond))

	// Every rule loaded, evaluates, and selects series that exist.
	rs, err := p.rulesEvaluatedAfter(ctx, time.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		for _, sel := range selectorRE.FindAllString(r.Query, -1) {
			got, err := p.query(ctx, sel)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				t.Errorf("alert %s: selector %s matches no series the lab's agents and coordinator export; the alert can never fire (expr: %s)", r.Name, sel, r.Query)
			}
		}
	}
	t.Logf("before the cutover: %s", ruleStates(rs))

	applied, err := p.byNode(ctx, `cutover_agent_apply_duration_seconds_count{job="`+agentJob+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	succeeded, err := p.query(ctx, `cutover_coordinator_operations_total{outcome="succeeded"}`)
	if err != nil || len(succeeded) != 1 {
		t.Fatalf("operations_total{outcome=succeeded} before the cutover: %v %v", succeeded, err)
	}
	probesBefore, err := p.query(ctx, `cutover_agent_probe_sent_total`)
	if err != nil {
		t.Fatal(err)
	}

	cmd, err := l.CoordctlCommand(ctx, filepath.Join(bin, "coordctl"), "cutover", "--port", "4889", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	rep := &coordinatorv1.Report{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(out, rep); err != nil {
		t.Fatalf("cutover report: %v\n%s", err, out)
	}
	if rep.GetState() != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Fatalf("cutover: %s: %s", rep.GetState(), rep.GetError())
	}
	done := time.Now()
	wantPorts(t, l, portMap(l, 4889, nil))

	// What Prometheus has after its next scrapes.
	var ports map[string]float64
	if err := eventually(ctx, 10*time.Second, func() error {
		var err error
		if ports, err = p.byNode(ctx, `cutover_agent_current_port`); err != nil {
			return err
		}
		for _, n := range nodes {
			if ports[n.Name] != 4889 {
				return fmt.Errorf("cutover_agent_current_port by node %v, want 4889 on all %d", ports, len(nodes))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("prometheus saw every node on 4889 %s after coordctl returned", time.Since(done).Round(time.Millisecond))
	if err := eventually(ctx, 10*time.Second, func() error {
		after, err := p.byNode(ctx, `cutover_agent_apply_duration_seconds_count{job="`+agentJob+`"}`)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if after[n.Name] < applied[n.Name]+1 {
				return fmt.Errorf("apply-duration count by node %v, before the cutover %v: want one more commit on every node", after, applied)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if err := eventually(ctx, 10*time.Second, func() error {
		s, err := p.query(ctx, `cutover_coordinator_operations_total{outcome="succeeded"}`)
		if err != nil {
			return err
		}
		if len(s) != 1 || s[0].Value < succeeded[0].Value+1 {
			return fmt.Errorf("operations_total{outcome=succeeded} %v, before the cutover %v: want one more", s, succeeded[0].Value)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	spread, err := p.query(ctx, `cutover_coordinator_commit_spread_seconds{job="`+coordinatorJob+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	wantSpread := time.Duration(rep.GetCommitSpreadNanos()).Seconds()
	if len(spread) != 1 || math.Abs(spread[0].Value-wantSpread) > 1e-9 {
		t.Errorf("cutover_coordinator_commit_spread_seconds %v, want the report's %gs", spread, wantSpread)
	} else {
		t.Logf("commit spread %s (report and metric agree)", time.Duration(rep.GetCommitSpreadNanos()))
	}
	probes, err := p.query(ctx, `cutover_agent_probe_sent_total`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(probes), len(nodes)*(len(nodes)-1); got != want || len(probesBefore) != want {
		t.Errorf("cutover_agent_probe_sent_total: %d series after, %d before, want %d (one per ordered pair)", got, len(probesBefore), want)
	}
	before := map[string]float64{}
	for _, s := range probesBefore {
		before[s.Metric["node"]+"→"+s.Metric["peer"]] = s.Value
	}
	for _, s := range probes {
		if pair := s.Metric["node"] + "→" + s.Metric["peer"]; s.Value <= before[pair] {
			t.Errorf("probes %s: sent %g after the cutover, %g before: the mesh stopped", pair, s.Value, before[pair])
		}
	}
	// The rules judge each agent's last scrape, and one taken between the
	// commit and the finalize still shows the committed phase (a CI run
	// saw CutoverAgentOperationStuck pending for that): first wait for
	// scrapes that show every agent out of the operation's middle phases.
	// An agent whose gauge stays there fails here.
	if err := eventually(ctx, 10*time.Second, func() error {
		s, err := p.query(ctx, `cutover_agent_operation_phase{phase=~"preparing|prepared|committed"} == 1`)
		if err != nil {
			return err
		}
		if len(s) != 0 {
			return fmt.Errorf("agents in a middle phase of the operation by their last scrape after it ended: %v", s)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	rs, err = p.rulesEvaluatedAfter(ctx, time.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.State != "inactive" {
			t.Errorf("after the cutover, alert %s is %s (expr: %s)", r.Name, r.State, r.Query)
		}
	}
	t.Logf("after the cutover: %s", ruleStates(rs))

	// Drift: one node back on the old port, set in OVS behind its agent.
	drifted := nodes[1].Name
	if err := l.SetPortDirect(ctx, drifted, 4789); err != nil {
		t.Fatal(err)
	}
	wantPorts(t, l, portMap(l, 4889, map[string]int{drifted: 4789}))
	driftAt := time.Now()
	driftFiring := func() error {
		rs, err := p.rules(ctx)
		if err != nil {
			return err
		}
		ports, _ := p.byNode(ctx, `cutover_agent_current_port`)
		state := fmt.Sprintf("cutover_agent_current_port by node %v; alerts %s", ports, ruleStates(rs))
		for _, r := range rs {
			if r.Name == "CutoverPortDrift" && r.State == "firing" {
				return nil
			}
		}
		return errors.New(state)
	}
	if err := eventually(ctx, 15*time.Second, driftFiring); err != nil {
		t.Errorf("%s on 4789 behind its agent's back, 4889 elsewhere: CutoverPortDrift not firing after %s (for: %s): %v",
			drifted, time.Since(driftAt).Round(time.Millisecond), promFor, err)
		// Tell a stale gauge from a broken rule: any Info call (here
		// `coordctl agents`) makes each agent read its port back.
		cmd, err := l.CoordctlCommand(ctx, filepath.Join(bin, "coordctl"), "agents")
		if err != nil {
			t.Fatal(err)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
		}
		driftAt = time.Now()
		if err := eventually(ctx, 15*time.Second, driftFiring); err != nil {
			t.Fatalf("CutoverPortDrift not firing %s after `coordctl agents` refreshed the agents' ports either: %v", time.Since(driftAt).Round(time.Millisecond), err)
		}
		t.Logf("CutoverPortDrift fires %s after `coordctl agents` made the agents read their ports back: the rule works, the agent's gauge is stale between Info calls",
			time.Since(driftAt).Round(time.Millisecond))
	} else {
		t.Logf("CutoverPortDrift firing %s after %s moved to 4789 behind its agent (for: %s)",
			time.Since(driftAt).Round(time.Millisecond), drifted, promFor)
	}
	var alerts struct {
		Alerts []struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
			State       string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.api(ctx, "alerts", nil, &alerts); err != nil {
		t.Fatal(err)
	}
	var firing []string
	for _, a := range alerts.Alerts {
		firing = append(firing, a.Labels["alertname"]+"="+a.State)
		if a.Labels["alertname"] == "CutoverPortDrift" {
			if d := a.Annotations["description"]; !strings.Contains(d, "between 4789 and 4889") {
				t.Errorf("CutoverPortDrift description %q does not name the two ports", d)
			}
		}
	}
	sort.Strings(firing)
	if want := "CutoverPortDrift=firing"; strings.Join(firing, " ") != want {
		t.Errorf("active alerts after the drift: %v, want only %s", firing, want)
	}
}
