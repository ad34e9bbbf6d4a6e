package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/cluster"
	"github.com/cutover-dev/cutover/harness/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// e2e is one installed cluster under test.
type e2e struct {
	t   *testing.T
	res e2eResults
	c   *cluster.Cluster
	im  e2eImages
	dir string
	bin string // kubectl-cutover and coordctl, on the plugin's PATH
	// manifest is the applied release manifest; lastPort the overlay's.
	manifest string
	lastPort int
	// agentRef is the agent image the DaemonSet runs now (pinned).
	agentRef string
	// nodePort reads a node's VXLAN port from the node itself; flannel:
	// the overlay is flannel's, whose ConfigMap must follow the port;
	// stagedZero: the default strategy runs staged here, so nothing may be
	// lost.
	nodePort   func(n *cluster.Node) (int, error)
	flannel    bool
	stagedZero bool
}

// startCluster starts the tier with the release's images and extra (more
// image tarballs) imported on every node; ovsPort 0: no OVS overlay.
func startCluster(t *testing.T, im e2eImages, ovsPort int, extra ...string) *e2e {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := cluster.Up(ctx, cluster.Config{Name: "cote2e", Dir: filepath.Join(dir, "cluster"),
		Images: append([]string{im.pause, im.agent, im.coordinator}, extra...), PauseImage: im.pauseRef, OVSPort: ovsPort, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, c)
		}
		if err := c.Down(); err != nil {
			t.Errorf("cluster down: %v", err)
		}
	})
	e := &e2e{t: t, c: c, im: im, dir: dir, bin: im.bin}
	e.nodePort = func(n *cluster.Node) (int, error) { return n.KernelPort(context.Background()) }
	if ovsPort != 0 {
		e.nodePort = func(n *cluster.Node) (int, error) { return n.OVSPort(context.Background()) }
	}
	return e
}

// keepLogs copies the cluster's logs where a CI run keeps them.
func keepLogs(t *testing.T, c *cluster.Cluster) {
	if d := os.Getenv("COT_CLUSTER_LOGS"); d != "" {
		_ = os.MkdirAll(d, 0o755)
		_, _ = exec.Command("sh", "-c", fmt.Sprintf("cp -r %s/*.log %s/ 2>/dev/null; for n in %s/n*; do mkdir -p %s/$(basename $n); cp $n/*.log %s/$(basename $n)/; done", c.Dir(), d, c.Dir(), d, d)).CombinedOutput()
	}
}

func (e *e2e) kubectl(args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := e.c.Kubectl(ctx, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// plugin runs `kubectl cutover ARGS` (the kubectl-cutover plugin found on
// PATH, as a user installs it) and returns output and exit code.
func (e *e2e) plugin(timeout time.Duration, args ...string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := e.c.Command(ctx, append([]string{cluster.KubectlPath(), "cutover"}, args...)...)
	cmd.Env = append(cmd.Env, "PATH="+e.bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("kubectl cutover %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	e.t.Logf("kubectl cutover %s: exit %d\n%s", strings.Join(args, " "), code, out)
	return string(out), code
}

// install does what docs/install.md says for the flannel overlay with
// pre-made Secrets: certificates from coordctl certs, the three Secrets,
// the release manifest (images pinned by digest) applied with kubectl.
func (e *e2e) install(overlay string, patches ...string) {
	t := e.t
	var ips []string
	for _, n := range e.c.Nodes {
		ips = append(ips, n.IP().String())
	}
	pkiDir := filepath.Join(e.dir, "pki")
	if out, err := exec.Command(filepath.Join(e.bin, "coordctl"), "certs", "--dir", pkiDir,
		"--agent", "agent="+strings.Join(ips, ","), "--coordinator-ip", strings.Join(ips, ",")).CombinedOutput(); err != nil {
		t.Fatalf("coordctl certs: %v\n%s", err, out)
	}
	e.kubectl("create", "namespace", "cutover")
	for _, s := range []struct{ name, crt string }{{"cutover-agent-tls", "agent-agent"}, {"cutover-coordinator-tls", "coordinator"}, {"cutover-admin-tls", "admin"}} {
		e.kubectl("-n", "cutover", "create", "secret", "generic", s.name,
			"--from-file=ca.crt="+filepath.Join(pkiDir, "ca.pem"),
			"--from-file=tls.crt="+filepath.Join(pkiDir, s.crt+".pem"),
			"--from-file=tls.key="+filepath.Join(pkiDir, s.crt+"-key.pem"))
	}
	e.manifest = e.render(overlay, patches...)
	e.agentRef = e.im.pinned[agentRepo]
	e.kubectl("apply", "-f", e.manifest)
	e.waitRollout()
}

// render is the release manifest of overlay with this test's images pinned
// by digest, as make release writes it.
func (e *e2e) render(overlay string, patches ...string) string {
	t := e.t
	d := filepath.Join(e.dir, "render-"+overlay)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// kustomize takes no absolute resource paths: a copy of deploy/ beside
	// the kustomization, as make release-manifests does.
	if out, err := exec.Command("cp", "-r", filepath.Join(repoRoot(t), "deploy"), d).CombinedOutput(); err != nil {
		t.Fatalf("copy deploy/: %v: %s", err, out)
	}
	// Pinned by digest, as make release writes the manifests.
	pin := func(repo string) string {
		d := strings.SplitN(e.im.pinned[repo], "@", 2)
		if len(d) != 2 {
			t.Fatalf("images.txt pins no digest for %s", repo)
		}
		return d[1]
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deploy/%s]\nimages:\n- {name: %s, digest: %q}\n- {name: %s, digest: %q}\n",
		overlay, agentRepo, pin(agentRepo), coordRepo, pin(coordRepo))
	if len(patches) > 0 {
		k += "patches:\n" + strings.Join(patches, "\n") + "\n"
	}
	if err := os.WriteFile(filepath.Join(d, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubetest.KustomizePath(), "build", d).Output()
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	f := filepath.Join(d, "cutover.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (e *e2e) waitRollout() {
	e.kubectl("-n", "cutover", "rollout", "status", "ds/cutover-agent", "--timeout=180s")
	e.kubectl("-n", "cutover", "rollout", "status", "deploy/cutover-coordinator", "--timeout=180s")
}

// ports reads every node's VXLAN port from the node's kernel.
func (e *e2e) kernelPorts() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, n := range e.c.Nodes {
		p, err := e.nodePort(n)
		if err != nil {
			e.t.Fatal(err)
		}
		out[n.Name] = p
	}
	return out
}

func (e *e2e) wantKernelPorts(want int) {
	e.t.Helper()
	for n, p := range e.kernelPorts() {
		if p != want {
			e.t.Errorf("node %s: flannel.1 dstport %d, want %d (read from the node's kernel)", n, p, want)
		}
	}
}

// flannelConfig is the kube-flannel-cfg ConfigMap flannel's manifest
// installs, Backend.Port set.
func (e *e2e) flannelConfig(port int) {
	e.kubectl("create", "namespace", "kube-flannel")
	nc := fmt.Sprintf(`{"Network": %q, "EnableNFTables": false, "Backend": {"Type": "vxlan", "Port": %d}}`, cluster.PodCIDR.String(), port)
	e.kubectl("-n", "kube-flannel", "create", "configmap", "kube-flannel-cfg", "--from-literal=net-conf.json="+nc)
}

func (e *e2e) flannelPort() int {
	e.t.Helper()
	cs, err := e.c.Clientset()
	if err != nil {
		e.t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps("kube-flannel").Get(context.Background(), "kube-flannel-cfg", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var nc struct{ Backend struct{ Port int } }
	if err := json.Unmarshal([]byte(cm.Data["net-conf.json"]), &nc); err != nil {
		e.t.Fatal(err)
	}
	return nc.Backend.Port
}

// TestInstallKernelVXLAN installs Cutover from its release manifests onto a
// real cluster whose nodes run a flannel-style kernel VXLAN overlay, and
// drives it through kubectl cutover as docs/install.md says: every change
// under a ping ring across the overlay, every port read back from the
// nodes' kernels, between changes what an admin does to a running install
// (restarts, a leader lost, an agent upgrade, a node rebooted), bad input,
// and the uninstall.
func TestInstallKernelVXLAN(t *testing.T) {
	cluster.Require(t)
	im := buildImages(t, "v0.0.0-e2e")
	e := startCluster(t, im, 0)
	ctx := context.Background()
	if err := e.c.KernelOverlay(ctx, 8472); err != nil {
		t.Fatal(err)
	}
	e.flannelConfig(8472)
	installStart := time.Now()
	e.flannel, e.stagedZero = true, true
	e.install("overlays/flannel")
	e.res.TierUpMs = benchMs(e.c.StartupTime)
	e.res.InstallMs = benchMs(time.Since(installStart))
	t.Log(e.kubectl("-n", "cutover", "get", "pods", "-o", "wide"))
	// The coordinator's two replicas never share a node.
	if nodes := e.podNodes("app.kubernetes.io/name=cutover-coordinator"); len(nodes) != 2 || nodes[0] == nodes[1] {
		t.Fatalf("coordinator replicas on nodes %v, want 2 different nodes", nodes)
	}

	step := func(name string, fn func(t *testing.T)) {
		if !t.Run(name, fn) {
			t.FailNow() // each step starts from the state the last one left
		}
	}
	step("plan", func(t *testing.T) {
		out, code := e.plugin(2*time.Minute, "plan", "--port", "4889")
		if code != 0 || !strings.Contains(out, "may go") {
			t.Fatalf("kubectl cutover plan --port 4889: exit %d, want 0 and \"may go\"\n%s", code, out)
		}
		e.wantKernelPorts(8472) // plan changes nothing (I3)
	})
	step("cutover", func(t *testing.T) { e.change(t, "cutover", 4889) })
	step("rollback", func(t *testing.T) { e.change(t, "rollback", 8472) })
	step("coordinator rollout restart", func(t *testing.T) {
		e.kubectl("-n", "cutover", "rollout", "restart", "deploy/cutover-coordinator")
		e.waitRollout()
		e.waitLeader(t, "")
		e.change(t, "cutover", 4889)
	})
	step("leader pod deleted", func(t *testing.T) {
		old := e.waitLeader(t, "")
		e.kubectl("-n", "cutover", "delete", "pod", old, "--wait=false")
		e.waitLeader(t, old)
		e.waitRollout()
		e.change(t, "cutover", 8472)
	})
	step("agent rolling update", func(t *testing.T) {
		v2, ref := buildAgentImage(t, e.im, "v0.0.0-e2e2")
		e.im.agentV2 = v2
		for _, n := range e.c.Nodes {
			if err := n.ImportImage(ctx, v2); err != nil {
				t.Fatal(err)
			}
		}
		e.kubectl("-n", "cutover", "set", "image", "ds/cutover-agent", "agent="+ref)
		e.agentRef = ref
		e.waitRollout()
		out := e.kubectl("-n", "cutover", "get", "pods", "-l", "app.kubernetes.io/name=cutover-agent", "-o", "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}")
		if strings.Count(out, ref) != len(e.c.Nodes) {
			t.Fatalf("agent pods after the rolling update run:\n%s\nwant every one on %s", out, ref)
		}
		e.change(t, "cutover", 4889)
	})
	step("node rebooted behind a default-deny firewall", func(t *testing.T) { e.reboot(t, e.c.Nodes[1], 4889) })
	step("bad input changes nothing", func(t *testing.T) { e.badInput(t, 4889) })
	step("uninstall", func(t *testing.T) { e.uninstall(t) })
	e.saveResults(t)
}

// change runs kubectl cutover VERB (cutover --port to, or rollback) under
// the ring and checks the exit code, every node's port from its kernel,
// flannel's ConfigMap, and that the overlay carried the ring throughout.
// It returns what kubectl cutover printed.
func (e *e2e) change(t *testing.T, verb string, to int) string {
	t.Helper()
	args := []string{verb}
	if verb == "cutover" {
		args = append(args, "--port", fmt.Sprint(to))
		if to == 8472 {
			// flannel's default is another tunnel's port to the coordinator's
			// preflight: going back to it by a cutover is asked for by name.
			args = append(args, "--allow-tunnel-port")
		}
	}
	ring, err := e.c.StartRing(10 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	out, code := e.plugin(3*time.Minute, args...)
	took := time.Since(begin)
	time.Sleep(200 * time.Millisecond) // the ring's last replies
	pairs, rerr := ring.Stop()
	if code != 0 {
		t.Fatalf("kubectl cutover %s: exit %d, want 0\n%s", strings.Join(args, " "), code, out)
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	e.wantKernelPortsT(t, to)
	if e.flannel {
		if p := e.flannelPort(); p != to {
			t.Errorf("kube-flannel-cfg Backend.Port %d after %s, want %d", p, verb, to)
		}
	}
	row := ringRow{Step: t.Name(), Verb: verb, To: to, Ms: benchMs(took)}
	for _, p := range pairs {
		row.Sent += p.Sent
		row.Lost += p.Lost()
	}
	e.res.Changes = append(e.res.Changes, row)
	t.Logf("ring during %s: %d of %d lost (%+v)", verb, row.Lost, row.Sent, pairs)
	// The default strategy on kernel VXLAN is staged: make before break,
	// nothing may be lost. Elsewhere it is atomic: the split lasts the
	// commit spread, a few pings of each pair at most.
	if e.stagedZero && row.Lost > 0 {
		t.Errorf("the overlay lost %d of %d ring packets during kubectl cutover %s (staged: want 0)", row.Lost, row.Sent, strings.Join(args, " "))
	}
	if max := 3 * len(pairs); !e.stagedZero && row.Lost > max {
		t.Errorf("the overlay lost %d of %d ring packets during kubectl cutover %s (atomic: want at most %d, 3 per pair)", row.Lost, row.Sent, strings.Join(args, " "), max)
	}
	return out
}

func (e *e2e) wantKernelPortsT(t *testing.T, want int) {
	t.Helper()
	for _, n := range e.c.Nodes {
		p, err := e.nodePort(n)
		if err != nil {
			t.Fatal(err)
		}
		if p != want {
			t.Errorf("node %s: VXLAN port %d, want %d (read from the node itself)", n.Name, p, want)
		}
	}
}

// podNodes lists the nodes of the pods matching selector.
func (e *e2e) podNodes(selector string) []string {
	out := e.kubectl("-n", "cutover", "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].spec.nodeName}")
	return strings.Fields(out)
}

// waitLeader waits until the coordinator Lease names a running pod other
// than not, and returns it.
func (e *e2e) waitLeader(t *testing.T, not string) string {
	t.Helper()
	cs, err := e.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := cs.CoordinationV1().Leases("cutover").Get(context.Background(), "cutover-coordinator", metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && *l.Spec.HolderIdentity != not {
			p, perr := cs.CoreV1().Pods("cutover").Get(context.Background(), *l.Spec.HolderIdentity, metav1.GetOptions{})
			if perr == nil && p.Status.Phase == "Running" && p.DeletionTimestamp == nil {
				return p.Name
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no coordinator leads 2 minutes on (the previous leader was %q)", not)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// printedStep is one of the report's next steps as kubectl cutover prints
// it: its text (wrapped lines joined, whitespace normalised) and its
// command lines (each on a line of its own, indented deeper, unbroken).
type printedStep struct {
	text string
	cmds []string
}

// printedNextSteps reads the "next steps" list at the end of kubectl
// cutover's output: "  - " starts a step, a line indented by four
// continues its text, one indented by six is a command.
func printedNextSteps(out string) []printedStep {
	_, rest, ok := strings.Cut(out, "\nnext steps")
	if !ok {
		return nil
	}
	var steps []printedStep
	for _, l := range strings.Split(rest, "\n")[1:] {
		switch {
		case strings.HasPrefix(l, "  - "):
			steps = append(steps, printedStep{text: strings.TrimPrefix(l, "  - ")})
		case len(steps) > 0 && strings.HasPrefix(l, "      "):
			steps[len(steps)-1].cmds = append(steps[len(steps)-1].cmds, strings.TrimSpace(l))
		case len(steps) > 0 && strings.HasPrefix(l, "    "):
			steps[len(steps)-1].text += " " + strings.TrimSpace(l)
		default:
			return steps
		}
	}
	return steps
}

func benchMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type ringRow struct {
	Step string  `json:"step"`
	Verb string  `json:"verb"`
	To   int     `json:"toPort"`
	Ms   float64 `json:"ms"`
	Sent int     `json:"ringSent"`
	Lost int     `json:"ringLost"`
}

type e2eResults struct {
	TierUpMs  float64   `json:"tierUpMs"`
	InstallMs float64   `json:"installMs"`
	Changes   []ringRow `json:"changes"`
}
