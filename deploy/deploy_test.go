// Package deploy_test checks the manifests in deploy/: rendered with the
// pinned kustomize, their content against what the binaries accept (flags,
// metric names), and every kustomization against a real kube-apiserver in a
// server-side dry run (harness/kubetest).
package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/testenv"
	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// kustomizations are every entry point a user builds.
var kustomizations = []string{"base", "overlays/openshift", "overlays/flannel", "overlays/calico", "overlays/full"}

// CRD sources for the dry run: the upstream definitions, fetched as Go
// modules (never committed here), so the dry run checks our PodMonitor,
// PrometheusRule, Issuer and Certificate against their real schemas.
var crdModules = []struct {
	module, version string
	files           []string
}{
	{"github.com/prometheus-operator/prometheus-operator", "v0.85.0", []string{
		"example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
	}},
	{"github.com/cert-manager/cert-manager", "v1.21.2", []string{
		"deploy/crds/cert-manager.io_issuers.yaml",
		"deploy/crds/cert-manager.io_certificates.yaml",
	}},
}

func render(t *testing.T, k string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := kubetest.DecodeYAML(kubetest.Kustomize(t, k))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("rendered manifests have no %s %s", kind, name)
}

func TestAgentDaemonSet(t *testing.T) {
	for _, k := range kustomizations {
		t.Run(strings.ReplaceAll(k, "/", "_"), func(t *testing.T) {
			var ds appsv1.DaemonSet
			find(t, render(t, k), "DaemonSet", "cutover-agent", &ds)
			if err := checkAgent(&ds); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkAgent holds the agent DaemonSet to the requirements of
// docs/design.md (R6; privileged, host network, every taint, OVS run dir, xtables
// lock, state dir, probes, resources).
func checkAgent(ds *appsv1.DaemonSet) error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	ps := ds.Spec.Template.Spec
	if !ps.HostNetwork {
		bad("agent: hostNetwork must be true (requirement 6: the control path must not use the overlay)")
	}
	if ps.HostPID {
		bad("agent: hostPID must be false")
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool {
		return t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == ""
	}) {
		bad("agent: no toleration {operator: Exists}: nodes with taints would run no agent and fail preflight")
	}
	if ps.NodeSelector[corev1.LabelOSStable] != "linux" {
		bad("agent: nodeSelector %s=%q, want linux: the agent is a Linux binary driving a Linux dataplane", corev1.LabelOSStable, ps.NodeSelector[corev1.LabelOSStable])
	}
	if len(ps.Containers) != 1 {
		return fmt.Errorf("agent: %d containers, want 1", len(ps.Containers))
	}
	c := ps.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		bad("agent: container must be privileged")
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, p := range []string{"/var/run/openvswitch", "/run/xtables.lock", "/var/lib/cutover"} {
		if hostPaths[mounts[p]] != p {
			bad("agent: %s must be the host's %s (hostPath), got volume %q → %q", p, p, mounts[p], hostPaths[mounts[p]])
		}
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path || pr.probe.HTTPGet.Port.String() != "metrics" {
			bad("agent: %s probe must GET %s on the metrics port", pr.name, pr.path)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			bad("agent: no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			bad("agent: no %s limit", r)
		}
	}
	return errors.Join(errs...)
}

// probeInterfaces is the overlay interface each kustomization's agents
// probe from: the node's address on the overlay for its CNI.
var probeInterfaces = map[string]string{
	"base": "tun0", "overlays/openshift": "tun0", "overlays/full": "tun0",
	"overlays/flannel": "flannel.1", "overlays/calico": "vxlan.calico",
}

// Every shipped agent runs the probe mesh on its CNI's overlay
// interface, and declares the probe port, so verify can prove the overlay
// carries traffic (I7) on a real cluster, not in the lab only.
func TestAgentProbesTheOverlay(t *testing.T) {
	for _, k := range kustomizations {
		t.Run(strings.ReplaceAll(k, "/", "_"), func(t *testing.T) {
			var ds appsv1.DaemonSet
			find(t, render(t, k), "DaemonSet", "cutover-agent", &ds)
			if err := checkProbe(&ds, probeInterfaces[k]); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkProbe holds the agent to the probe mesh: on, on iface, on a port the
// container declares as UDP.
func checkProbe(ds *appsv1.DaemonSet, iface string) error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	c := ds.Spec.Template.Spec.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		name, v, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			v = "true"
		}
		args[name] = v
	}
	if v, ok := args["probe"]; ok && v != "true" {
		bad("agent: --probe=%s: the probe mesh must be on (verify has nothing but read-back without it)", v)
	}
	if args["probe-listen"] != "" || args["probe-address"] != "" || args["probe-peers"] != "" {
		bad("agent: --probe-listen/--probe-address/--probe-peers are per node: a DaemonSet must let each agent find its address and the coordinator pick peers")
	}
	if got := args["probe-interface"]; got != iface {
		bad("agent: --probe-interface=%q, want %q (the CNI's overlay interface)", got, iface)
	}
	port := args["probe-port"]
	if port == "" {
		port = "9445"
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "probe" && p.Protocol == corev1.ProtocolUDP && fmt.Sprint(p.ContainerPort) == port
	}) {
		bad("agent: no container port probe %s/UDP for the probe mesh", port)
	}
	return errors.Join(errs...)
}

func TestProbeCheckFailsOnBadDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	find(t, render(t, "base"), "DaemonSet", "cutover-agent", &ds)
	c := &ds.Spec.Template.Spec.Containers[0]
	c.Args = append(slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--probe") }),
		"--probe=false", "--probe-listen=198.19.1.1:9445", "--probe-port=9999")
	err := checkProbe(&ds, "tun0")
	for _, want := range []string{"--probe=false", "per node", `--probe-interface=""`, "probe 9999/UDP"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check did not flag %s: %v", want, err)
		}
	}
}

func TestAgentCheckFailsOnBadDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	find(t, render(t, "base"), "DaemonSet", "cutover-agent", &ds)
	ds.Spec.Template.Spec.HostNetwork = false
	ds.Spec.Template.Spec.Tolerations = nil
	ds.Spec.Template.Spec.Containers[0].LivenessProbe = nil
	ds.Spec.Template.Spec.NodeSelector = nil
	err := checkAgent(&ds)
	for _, want := range []string{"hostNetwork", "operator: Exists", "liveness", `nodeSelector kubernetes.io/os="", want linux`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check did not flag %s: %v", want, err)
		}
	}
}

func TestCoordinatorDeployment(t *testing.T) {
	need := coordinatorNeeds(t)
	for _, k := range kustomizations {
		t.Run(strings.ReplaceAll(k, "/", "_"), func(t *testing.T) {
			var d appsv1.Deployment
			find(t, render(t, k), "Deployment", "cutover-coordinator", &d)
			if err := checkCoordinator(&d, need); err != nil {
				t.Error(err)
			}
		})
	}
}

// coordinatorFigures is where the coordinator's resources come from.
const coordinatorFigures = "../results/coordinator_scale_sim.json"

// needs is what the coordinator must be allowed: the peak RSS of an
// operation on 1,000 agents (the most the manifests are sized for; a few
// hundred nodes stay under it) in any way the benchmark ran it, and the
// GOMAXPROCS it ran with.
type needs struct {
	memory resource.Quantity
	cpu    resource.Quantity
}

func coordinatorNeeds(t *testing.T) needs {
	t.Helper()
	b, err := os.ReadFile(coordinatorFigures)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Setup   string `json:"setup"`
		Results []struct {
			Agents int     `json:"agents"`
			RSS    float64 `json:"process_max_rss_mb"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", coordinatorFigures, err)
	}
	var rss float64
	for _, r := range f.Results {
		if r.Agents == 1000 {
			rss = max(rss, r.RSS)
		}
	}
	m := regexp.MustCompile(`GOMAXPROCS=(\d+)`).FindStringSubmatch(f.Setup)
	if rss == 0 || m == nil {
		t.Fatalf("%s: no 1,000-agent peak RSS (%v) or no GOMAXPROCS in its setup %q", coordinatorFigures, rss, f.Setup)
	}
	return needs{memory: *resource.NewQuantity(int64(math.Ceil(rss))<<20, resource.BinarySI), cpu: resource.MustParse(m[1])}
}

// checkCoordinator holds the coordinator Deployment to what it runs on
// and needs: host network, two replicas, non-root, the control-plane
// taint tolerated, Linux nodes only, and limits at least what the
// benchmarks measured at 1,000 agents.
func checkCoordinator(d *appsv1.Deployment, need needs) error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	ps := d.Spec.Template.Spec
	if !ps.HostNetwork {
		bad("coordinator: hostNetwork must be true")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		bad("coordinator: replicas %v, want 2 (one leader, one standby)", d.Spec.Replicas)
	}
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		bad("coordinator: must run as non-root")
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == "node-role.kubernetes.io/control-plane"
	}) {
		bad("coordinator: must tolerate the control-plane taint")
	}
	if ps.NodeSelector[corev1.LabelOSStable] != "linux" {
		bad("coordinator: nodeSelector %s=%q, want linux: the image is a Linux binary", corev1.LabelOSStable, ps.NodeSelector[corev1.LabelOSStable])
	}
	if len(ps.Containers) != 1 {
		return errors.Join(append(errs, fmt.Errorf("coordinator: %d containers, want 1", len(ps.Containers)))...)
	}
	res := ps.Containers[0].Resources
	for _, r := range []struct {
		name corev1.ResourceName
		need resource.Quantity
	}{{corev1.ResourceMemory, need.memory}, {corev1.ResourceCPU, need.cpu}} {
		limit, ok := res.Limits[r.name]
		if !ok || limit.Cmp(r.need) < 0 {
			bad("coordinator: %s limit %s, want at least %s (an operation on 1,000 agents, %s)", r.name, limit.String(), r.need.String(), coordinatorFigures)
		}
		if req, ok := res.Requests[r.name]; !ok || req.Cmp(limit) > 0 {
			bad("coordinator: %s request %s: want one, at most the limit %s", r.name, req.String(), limit.String())
		}
	}
	return errors.Join(errs...)
}

func TestCoordinatorCheckFailsOnBadDeployment(t *testing.T) {
	var d appsv1.Deployment
	find(t, render(t, "base"), "Deployment", "cutover-coordinator", &d)
	d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelOSStable: "windows"}
	d.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	err := checkCoordinator(&d, coordinatorNeeds(t))
	for _, want := range []string{`nodeSelector kubernetes.io/os="windows", want linux`, "memory limit 256Mi, want at least 641Mi", "cpu limit 1, want at least 2"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check did not flag %s: %v", want, err)
		}
	}
}

// helpFlags builds pkg and returns the long flag names its -help lists.
func helpFlags(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, "../"+pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput() // exits 2 with flag's -help
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 3 {
		t.Fatalf("%s --help listed %d flags:\n%s", pkg, len(flags), out)
	}
	return flags
}

// argProblems returns the container's args that name a flag the binary does
// not have, or a $(VAR) the container does not define.
func argProblems(c corev1.Container, flags map[string]bool) []string {
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	var bad []string
	for _, a := range c.Args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !flags[name] {
			bad = append(bad, fmt.Sprintf("%q: the binary has no flag %q", a, name))
		}
		for _, m := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
			if !env[m[1]] {
				bad = append(bad, fmt.Sprintf("%q: $(%s) is not in the container's env", a, m[1]))
			}
		}
	}
	return bad
}

// Every flag a manifest passes must exist in the binary: a renamed flag
// would crash-loop the DaemonSet on every node.
func TestArgsMatchBinaryFlags(t *testing.T) {
	kubetest.RequireKustomize(t)
	agentFlags := helpFlags(t, "agent/cmd/agent")
	coordFlags := helpFlags(t, "coordinator/cmd/coordinator")
	for _, k := range kustomizations {
		objs := render(t, k)
		var ds appsv1.DaemonSet
		find(t, objs, "DaemonSet", "cutover-agent", &ds)
		for _, p := range argProblems(ds.Spec.Template.Spec.Containers[0], agentFlags) {
			t.Errorf("%s: agent: %s", k, p)
		}
		var d appsv1.Deployment
		find(t, objs, "Deployment", "cutover-coordinator", &d)
		for _, p := range argProblems(d.Spec.Template.Spec.Containers[0], coordFlags) {
			t.Errorf("%s: coordinator: %s", k, p)
		}
	}
	bad := argProblems(corev1.Container{Args: []string{"--no-such-flag=1", "--node-name=$(UNSET)"}}, agentFlags)
	if len(bad) != 2 {
		t.Errorf("arg check missed a bad flag or env reference: %v", bad)
	}
}

// metricNames are the metric families the binaries define, read from their
// source (Name: "cutover_..." in a metric's options, or the first argument
// of prometheus.NewDesc for const-metric collectors such as the probe
// mesh's), plus the series a histogram exposes.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, f := range []string{"../agent/metrics.go", "../coordinator/internal/metrics/metrics.go", "../agent/probe/metrics.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?:Name:\s+|NewDesc\(\s*)"(cutover_[a-z_]+)"`).FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	if !names["cutover_agent_current_port"] || !names["cutover_coordinator_operation_phase"] || !names["cutover_agent_probe_lost_total"] {
		t.Fatalf("metric names not found in the sources: %v", names)
	}
	return names
}

func unknownMetrics(expr string, known map[string]bool) []string {
	var bad []string
	for _, m := range regexp.MustCompile(`cutover_[a-z_]+`).FindAllString(expr, -1) {
		if !known[m] {
			bad = append(bad, m)
		}
	}
	return bad
}

// Alerts and the dashboard must query metrics that exist: a typo is an alert
// that never fires.
func TestMonitoringUsesRealMetrics(t *testing.T) {
	known := metricNames(t)
	objs := render(t, "overlays/full")
	var exprs []string
	for _, o := range objs {
		switch o.GetKind() {
		case "PrometheusRule":
			groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
			for _, g := range groups {
				rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
				for _, r := range rules {
					exprs = append(exprs, fmt.Sprint(r.(map[string]any)["expr"]))
				}
			}
		case "ConfigMap":
			if o.GetLabels()["grafana_dashboard"] != "1" {
				continue
			}
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			var dash struct {
				Panels []struct {
					Title   string
					Targets []struct{ Expr string }
				}
			}
			if err := json.Unmarshal([]byte(data["cutover.json"]), &dash); err != nil {
				t.Fatalf("dashboard JSON: %v", err)
			}
			if len(dash.Panels) == 0 {
				t.Fatal("dashboard has no panels")
			}
			for _, p := range dash.Panels {
				for _, tg := range p.Targets {
					exprs = append(exprs, tg.Expr)
				}
			}
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("found %d expressions in the PrometheusRule and dashboard, want both present", len(exprs))
	}
	for _, e := range exprs {
		if bad := unknownMetrics(e, known); len(bad) > 0 {
			t.Errorf("expression uses metrics no binary defines %v: %s", bad, e)
		}
	}
	if bad := unknownMetrics("rate(cutover_agent_no_such_total[5m])", known); len(bad) != 1 {
		t.Errorf("metric check missed an unknown name: %v", bad)
	}
}

// promtool checks the alert rules' syntax and runs the unit tests in
// testdata/alerts_test.yaml (each alert fires on the series it is for).
func TestAlertRules(t *testing.T) {
	testenv.RequireBinaries(t, "promtool")
	var rule *unstructured.Unstructured
	for _, o := range render(t, "overlays/full") {
		if o.GetKind() == "PrometheusRule" {
			rule = o
		}
	}
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	spec, _, _ := unstructured.NestedMap(rule.Object, "spec")
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// crdYAML fetches the upstream CRDs through the Go module proxy (cached in
// GOMODCACHE after the first run).
func crdYAML(t *testing.T) []byte {
	t.Helper()
	var all []byte
	for _, m := range crdModules {
		cmd := exec.Command("go", "mod", "download", "-json", m.module+"@"+m.version)
		cmd.Dir = t.TempDir() // outside the main module: go.mod stays untouched
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		var info struct{ Dir, Error string }
		if err == nil {
			err = json.Unmarshal(out, &info)
		}
		if err != nil || info.Dir == "" {
			msg := fmt.Sprintf("CRDs of %s@%s not downloadable (%v %s): the dry run of monitoring and cert-manager kinds needs the Go module proxy", m.module, m.version, err, info.Error)
			if testenv.InCI() {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		for _, f := range m.files {
			b, err := os.ReadFile(filepath.Join(info.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, "\n---\n"...)
			all = append(all, b...)
		}
	}
	b, err := os.ReadFile("testdata/crds/securitycontextconstraints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return append(append(all, "\n---\n"...), b...)
}

// Every kustomization is accepted by a real kube-apiserver in a server-side
// dry run (validation, defaulting, admission, CRD schemas), and the base's
// RBAC, applied for real, is what the coordinator needs and no more.
// servedByThisAPIServer drops the objects of API versions the test
// apiserver (1.35) no longer serves: the openshift overlay's
// PodDisruptionBudget is policy/v1beta1, for OpenShift 3.11, and is checked
// offline (TestOpenShiftOverlayFits311).
func servedByThisAPIServer(t *testing.T, y []byte) []byte {
	t.Helper()
	objs, err := kubetest.DecodeYAML(y)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, o := range objs {
		if o.GetAPIVersion() == "policy/v1beta1" {
			continue
		}
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, "---\n"...), append(b, '\n')...)
	}
	return out
}

// The openshift overlay targets OpenShift 3.11: the agent runs
// the openshift-sdn profile, the coordinator elects on a ConfigMap (3.11
// serves no Leases), the PDB is an API version 3.11 serves, and nothing
// else needs an API group 3.11 lacks.
func TestOpenShiftOverlayFits311(t *testing.T) {
	objs := render(t, "overlays/openshift")
	var ds appsv1.DaemonSet
	var d appsv1.Deployment
	find(t, objs, "DaemonSet", "cutover-agent", &ds)
	find(t, objs, "Deployment", "cutover-coordinator", &d)
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--profile=openshift-sdn") {
		t.Errorf("agent args %q: no --profile=openshift-sdn", ds.Spec.Template.Spec.Containers[0].Args)
	}
	if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--leader-lock=configmap") {
		t.Errorf("coordinator args %q: no --leader-lock=configmap", d.Spec.Template.Spec.Containers[0].Args)
	}
	// openshift-sdn refuses staged: the default auto would end atomic
	// after a staged preflight of every agent.
	if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--default-strategy=atomic") {
		t.Errorf("coordinator args %q: no --default-strategy=atomic", d.Spec.Template.Spec.Containers[0].Args)
	}
	served311 := map[string]bool{"v1": true, "apps/v1": true, "policy/v1beta1": true, "rbac.authorization.k8s.io/v1": true, "security.openshift.io/v1": true}
	for _, o := range objs {
		if !served311[o.GetAPIVersion()] {
			t.Errorf("%s %s is %s, which OpenShift 3.11 (Kubernetes 1.11) does not serve", o.GetKind(), o.GetName(), o.GetAPIVersion())
		}
	}
	for _, k := range []string{"overlays/flannel", "overlays/calico", "base"} {
		var d appsv1.Deployment
		find(t, render(t, k), "Deployment", "cutover-coordinator", &d)
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--leader-lock=") && a != "--leader-lock=lease" {
				t.Errorf("%s: %s: Leases are the default off OpenShift 3.11", k, a)
			}
		}
	}
}

func TestServerSideDryRun(t *testing.T) {
	kubetest.RequireKustomize(t)
	c := kubetest.Start(t)
	ctx := context.Background()
	if err := c.Apply(ctx, crdYAML(t), kubetest.ApplyOptions{}); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	// A dry-run object cannot land in a namespace that does not exist, and
	// a dry-run Namespace is not persisted: create them for real.
	if err := c.Apply(ctx, []byte(`
apiVersion: v1
kind: Namespace
metadata: {name: cutover}
---
apiVersion: v1
kind: Namespace
metadata: {name: kube-flannel}
---
apiVersion: v1
kind: Namespace
metadata: {name: openshift-sdn}
`), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(kustomizations, "testdata/openshift-field-report") {
		t.Run("dryrun_"+strings.ReplaceAll(k, "/", "_"), func(t *testing.T) {
			if err := c.Apply(ctx, servedByThisAPIServer(t, kubetest.Kustomize(t, k)), kubetest.ApplyOptions{DryRun: true, MappingTimeout: 30e9}); err != nil {
				t.Errorf("kube-apiserver refused %s:\n%v", k, err)
			}
		})
	}

	// The dry run is not a rubber stamp: a broken agent is refused.
	t.Run("dryrun_refuses_invalid", func(t *testing.T) {
		objs := render(t, "base")
		var broken []byte
		for _, o := range objs {
			if o.GetKind() == "DaemonSet" {
				vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
				vols[0].(map[string]any)["hostPath"].(map[string]any)["type"] = "Bogus"
				_ = unstructured.SetNestedSlice(o.Object, vols, "spec", "template", "spec", "volumes")
				broken, _ = o.MarshalJSON()
			}
		}
		err := c.Apply(ctx, broken, kubetest.ApplyOptions{DryRun: true})
		if err == nil || !strings.Contains(err.Error(), "Bogus") {
			t.Fatalf("dry run accepted a hostPath of type Bogus: %v", err)
		}
		// The upstream CRD schemas are enforced, not just the kinds.
		err = c.Apply(ctx, []byte(`
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: bad, namespace: cutover}
spec: {secretName: x, uris: cutover://role/agent, issuerRef: {name: cutover-ca}}
`), kubetest.ApplyOptions{DryRun: true})
		if err == nil || !strings.Contains(err.Error(), "spec.uris") {
			t.Fatalf("dry run accepted a Certificate with uris not a list: %v", err)
		}
	})

	t.Run("coordinator_rbac", func(t *testing.T) {
		if err := c.Apply(ctx, kubetest.Kustomize(t, "base"), kubetest.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		// The finalize components and the OpenShift RBAC, for real too:
		// rights by object name.
		var extra []byte
		for _, k := range []string{"overlays/full", "testdata/openshift-field-report"} {
			objs, err := kubetest.DecodeYAML(kubetest.Kustomize(t, k))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				switch o.GetKind() {
				case "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
					b, _ := o.MarshalJSON()
					extra = append(append(extra, b...), "\n---\n"...)
				}
			}
		}
		if err := c.Apply(ctx, extra, kubetest.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		cs, err := c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		sa := "system:serviceaccount:cutover:cutover-coordinator"
		groups := []string{"system:serviceaccounts", "system:serviceaccounts:cutover", "system:authenticated"}
		type ask struct {
			ns, group, resource, verb string
			want                      bool
			name                      string
		}
		asks := []ask{
			{"cutover", "", "pods", "list", true, ""},
			{"cutover", "", "pods", "watch", true, ""},
			{"", "", "nodes", "list", true, ""},
			{"cutover", "coordination.k8s.io", "leases", "update", true, ""},
			{"cutover", "", "configmaps", "update", true, ""},
			{"cutover", "", "events", "create", true, ""},
			// Least privilege: no secrets, nothing outside its namespace,
			// no writes to nodes or pods, no CNI objects without a component.
			{"cutover", "", "secrets", "get", false, ""},
			{"kube-system", "", "pods", "list", false, ""},
			{"kube-system", "", "configmaps", "get", false, ""},
			{"", "", "nodes", "update", false, ""},
			{"cutover", "", "pods", "delete", false, ""},
			{"kube-flannel", "", "configmaps", "update", false, ""},
			{"", "crd.projectcalico.org", "felixconfigurations", "update", false, ""},
			{"cutover", "apps", "daemonsets", "patch", false, ""},
			// No unused grants; CNI objects by name only.
			{"cutover", "events.k8s.io", "events", "create", false, ""},
			{"cutover", "", "events", "patch", false, ""},
			{"", "crd.projectcalico.org", "felixconfigurations", "update", true, "default"},
			{"", "crd.projectcalico.org", "felixconfigurations", "update", false, "other"},
			{"", "crd.projectcalico.org", "felixconfigurations", "list", false, ""},
			{"kube-flannel", "", "configmaps", "update", true, "kube-flannel-cfg"},
			{"kube-flannel", "", "configmaps", "patch", false, "kube-flannel-cfg"},
			{"", "network.openshift.io", "clusternetworks", "delete", true, "default"},
			{"", "network.openshift.io", "clusternetworks", "delete", false, "other"},
			{"", "network.openshift.io", "clusternetworks", "create", true, ""},
			{"openshift-sdn", "apps", "daemonsets", "get", true, "sdn"},
			{"openshift-sdn", "apps", "daemonsets", "get", false, "other"},
			{"openshift-sdn", "apps", "daemonsets", "patch", false, "sdn"},
		}
		var got []string
		for _, a := range asks {
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
				User: sa, Groups: groups,
				ResourceAttributes: &authv1.ResourceAttributes{Namespace: a.ns, Group: a.group, Resource: a.resource, Verb: a.verb, Name: a.name},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != a.want {
				got = append(got, fmt.Sprintf("%s %s.%s %q in %q: allowed=%v, want %v", a.verb, a.resource, a.group, a.name, a.ns, r.Status.Allowed, a.want))
			}
		}
		sort.Strings(got)
		for _, g := range got {
			t.Error("coordinator RBAC: " + g)
		}
		// The agent has no API access at all.
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: "system:serviceaccount:cutover:cutover-agent", Groups: groups[:1],
			ResourceAttributes: &authv1.ResourceAttributes{Namespace: "cutover", Resource: "pods", Verb: "list"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed {
			t.Error("agent service account may list pods; it should have no API access")
		}
	})
}

// TestMonitoringReleaseLabel renders the kustomization docs/observability.md
// gives for a Prometheus that selects on `release` (kube-prometheus-stack's
// default), against this tree: the label lands on both PodMonitors and the
// PrometheusRule, and on nothing else.
func TestMonitoringReleaseLabel(t *testing.T) {
	b, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, after, ok := strings.Cut(doc, "## Getting the rules and PodMonitors loaded")
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(after)
	if !ok || m == nil {
		t.Fatal("docs/observability.md: no yaml block under \"## Getting the rules and PodMonitors loaded\"")
	}
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Rel(dir, here) // kustomize takes no absolute roots
	if err != nil {
		t.Fatal(err)
	}
	// The remote references, as a user writes them, point at this tree.
	k := regexp.MustCompile(`github\.com/cutover-dev/cutover/deploy/([a-z/-]+)\?ref=[^\]\s,]+`).ReplaceAllString(m[1], root+"/$1")
	if k == m[1] {
		t.Fatalf("the documented kustomization names no github.com/cutover-dev/cutover/deploy/...?ref= path:\n%s", m[1])
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	var labelled []string
	for _, o := range render(t, dir) {
		if o.GetLabels()["release"] == "" {
			continue
		}
		labelled = append(labelled, o.GetKind()+"/"+o.GetName()+"="+o.GetLabels()["release"])
	}
	sort.Strings(labelled)
	want := "PodMonitor/cutover-agent=kube-prometheus-stack PodMonitor/cutover-coordinator=kube-prometheus-stack PrometheusRule/cutover=kube-prometheus-stack"
	if got := strings.Join(labelled, " "); got != want {
		t.Errorf("objects with a release label: %s\nwant: %s", got, want)
	}
}
