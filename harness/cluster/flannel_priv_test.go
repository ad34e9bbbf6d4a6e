package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/cluster"
)

// flannelResult is results/flannel_cluster.json: what each phase of
// TestFlannelCutover measured (benchresult adds its provenance).
type flannelResult struct {
	Flanneld  string   `json:"flanneld"`
	CNI       string   `json:"cni"`
	Interval  string   `json:"ringInterval"`
	Note      string   `json:"note"`
	Phases    []phase  `json:"phases"`
	Findings  []string `json:"findings"`
	Completed bool     `json:"completed"`
}

type phase struct {
	Name    string                `json:"name"`
	Seconds float64               `json:"seconds"`
	Ring    []cluster.PodRingPair `json:"ring,omitempty"`
	Lost    int                   `json:"lost"`
	Ports   map[string]int        `json:"ports,omitempty"`
	MACs    map[string]string     `json:"macs,omitempty"`
	Note    string                `json:"note,omitempty"`
}

// fl is one flannel cluster under test.
type fl struct {
	*e2e
	res  *flannelResult
	macs map[string]string // each node's flannel.1 MAC as flanneld made it
}

const ringInterval = 10 * time.Millisecond

// TestFlannelCutover runs the real flanneld (its DaemonSet, the Kubernetes
// subnet manager, kube-flannel-cfg) with pods on the overlay and drives
// Cutover through kubectl cutover around it, checking what
// docs/kernel-vxlan.md says flanneld does around a port change:
// the cutover and its rollback under a pod-to-pod ring, flanneld restarted
// one node at a time after each, a flanneld restarted while net-conf.json
// names the old port (the step Cutover's flannel handling exists for,
// shown failing), a node joining after a cutover, a node rebooted.
func TestFlannelCutover(t *testing.T) {
	cluster.Require(t)
	flImg := buildFlannelImage(t, t.TempDir()) // first: it skips without flanneld
	im := buildImages(t, "v0.0.0-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := cluster.Up(ctx, cluster.Config{Name: "cotfl", Dir: filepath.Join(dir, "cluster"),
		Images: []string{im.pause, im.agent, im.coordinator, flImg}, PauseImage: im.pauseRef, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, c: c, im: im, dir: dir, bin: im.bin, flannel: true, stagedZero: true,
		nodePort: func(n *cluster.Node) (int, error) { return n.KernelPort(context.Background()) }}
	f := &fl{e2e: e, res: newFlannelResult(), macs: map[string]string{}}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, c)
			for _, n := range c.Nodes {
				out, _ := c.Kubectl(context.Background(), "-n", "kube-flannel", "logs", "-l", "app=flannel", "--tail=40", "--prefix")
				t.Logf("flanneld logs (%s):\n%s", n.Name, out)
				break
			}
		}
		if _, err := benchresult.Write("flannel_cluster.json", f.res); err != nil {
			t.Error(err)
		}
		if err := c.Down(); err != nil {
			t.Errorf("cluster down: %v", err)
		}
	})

	// flanneld, then pods on its overlay, then Cutover.
	f.kubectlApply(cluster.FlannelManifest(flannelRef, 8472))
	f.kubectl("-n", "kube-flannel", "rollout", "status", "ds/kube-flannel-ds", "--timeout=180s")
	f.waitMesh(8472)
	for _, n := range c.Nodes {
		f.macs[n.Name] = f.device(n).MAC
	}
	f.annotations()
	f.kubectlApply(ringManifest(im.pauseRef))
	f.kubectl("rollout", "status", "ds/ring", "--timeout=180s")
	f.run("baseline", 2*time.Second, nil, 8472, true)
	f.install("overlays/flannel")

	// 1. The cutover (default strategy) under the ring.
	var restart []string // the flanneld restart the report printed
	f.run("cutover to 4889", time.Second, func() {
		out, code := f.plugin(3*time.Minute, "cutover", "--port", "4889")
		if code != 0 {
			t.Fatalf("kubectl cutover cutover --port 4889: exit %d\n%s", code, out)
		}
		restart = nextStepCommands(t, out, 4889)
	}, 4889, true)
	if p := f.flannelPort(); p != 4889 {
		t.Fatalf("kube-flannel-cfg Backend.Port %d after the cutover, want 4889", p)
	}

	// 2. flanneld restarted while net-conf.json still names the old port,
	// as without Cutover's flannel handling: the node's flanneld moves its
	// device back to 8472 and the node is cut off from every peer.
	f.setNetConf(8472)
	n1 := c.Nodes[0]
	f.restartFlanneld(n1)
	if d := f.device(n1); d.Port != 8472 {
		t.Errorf("flanneld restarted with net-conf.json Port 8472 left %s's flannel.1 on %d: docs/kernel-vxlan.md says it moves it back to 8472", n1.Name, d.Port)
	} else {
		f.finding(fmt.Sprintf("flanneld restarted with net-conf.json Port 8472 while its device was on 4889: recreated on 8472, MAC %s (before: %s)", d.MAC, f.macs[n1.Name]))
	}
	bite := f.run("flanneld restart, net-conf.json not updated (bite)", 2*time.Second, nil, -1, false)
	if bite == 0 {
		t.Errorf("a node whose flanneld put flannel.1 back on 8472 while its peers are on 4889 lost no pod packet: the bite does not bite")
	}
	f.setNetConf(4889)
	f.restartFlanneld(n1)

	// A flanneld that started before the cutover, its device deleted
	// (as a delete-then-add recreation would): flanneld (v0.28) watches
	// for that and rebuilds flannel.1 from the net-conf.json it read at
	// its start, whatever the ConfigMap says now.
	f.deleteDevice(c.Nodes[1])

	// 3. Every flanneld restarted one node at a time with net-conf.json
	// updated, by the commands the cutover's report printed as the admin's
	// next step: each keeps its device, port and MAC.
	f.run("rolling flanneld restart on 4889", time.Second, func() { f.runPrinted(restart) }, 4889, true)

	// 4. Rollback, then the rolling restart it printed.
	f.run("rollback to 8472", time.Second, func() {
		out, code := f.plugin(3*time.Minute, "rollback")
		if code != 0 {
			t.Fatalf("kubectl cutover rollback: exit %d\n%s", code, out)
		}
		restart = nextStepCommands(t, out, 8472)
	}, 8472, true)
	if p := f.flannelPort(); p != 8472 {
		t.Errorf("kube-flannel-cfg Backend.Port %d after the rollback, want 8472", p)
	}
	f.run("rolling flanneld restart on 8472", time.Second, func() { f.runPrinted(restart) }, 8472, true)

	// 5. A second cutover, then a node joins before any flanneld restarts.
	f.run("second cutover to 4889", time.Second, func() {
		out, code := f.plugin(3*time.Minute, "cutover", "--port", "4889")
		if code != 0 {
			t.Fatalf("kubectl cutover cutover --port 4889 (second): exit %d\n%s", code, out)
		}
		restart = nextStepCommands(t, out, 4889)
	}, 4889, true)
	f.join(restart)

	// 6. A node rebooted after the cutover.
	f.reboot(c.Nodes[1])
	f.res.Completed = true
}

// ringManifest is a pause pod on every node: the ring's endpoints.
func ringManifest(pause string) string {
	return `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ring, namespace: default}
spec:
  selector: {matchLabels: {app: ring}}
  template:
    metadata: {labels: {app: ring}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: pause, image: ` + pause + `, imagePullPolicy: Never}
`
}

// newFlannelResult's provenance (commit, time, cores, load) is written by
// benchresult.Write, as for every results file.
func newFlannelResult() *flannelResult {
	return &flannelResult{
		Flanneld: "flanneld " + cluster.FlannelVersion + " (hack/flannel-tools.sh, from github.com/flannel-io/flannel), DaemonSet with --kube-subnet-mgr",
		CNI:      "harness/cluster/flannelcni (stand-in for github.com/flannel-io/cni-plugin, refused by the module proxy) delegating to Debian's bridge + host-local",
		Interval: ringInterval.String(),
		Note:     "TestFlannelCutover (harness/cluster, real-cluster tier, 3 kubelets + 1 joining): ring = ping from each ring pod's netns to the next node's ring pod; lost = sequence numbers up to the last answered without an answer",
	}
}

func (f *fl) finding(s string) {
	f.t.Log("finding: " + s)
	f.res.Findings = append(f.res.Findings, s)
}

func (f *fl) kubectlApply(manifest string) {
	f.t.Helper()
	p := filepath.Join(f.dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(p, []byte(manifest), 0o644); err != nil {
		f.t.Fatal(err)
	}
	f.kubectl("apply", "-f", p)
}

func (f *fl) setNetConf(port int) {
	f.t.Helper()
	patch, _ := json.Marshal(map[string]any{"data": map[string]string{"net-conf.json": cluster.FlannelNetConf(port)}})
	f.kubectl("-n", "kube-flannel", "patch", "configmap", "kube-flannel-cfg", "--type=merge", "-p", string(patch))
}

func (f *fl) device(n *cluster.Node) cluster.FlannelDevice {
	f.t.Helper()
	d, err := n.Flannel(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// waitMesh waits until every node's flannel.1 is on port and holds an FDB
// entry and a neighbour for every other node, as flanneld writes them from
// the Node annotations.
func (f *fl) waitMesh(port int) {
	f.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var why []string
		for _, n := range f.c.Nodes {
			d, err := n.Flannel(context.Background())
			switch {
			case err != nil:
				why = append(why, err.Error())
			case d.Port != port:
				why = append(why, fmt.Sprintf("%s: port %d", n.Name, d.Port))
			case len(d.FDB) != len(f.c.Nodes)-1 || len(d.Neigh) != len(f.c.Nodes)-1:
				why = append(why, fmt.Sprintf("%s: %d FDB entries, %d neighbours", n.Name, len(d.FDB), len(d.Neigh)))
			}
		}
		if len(why) == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("flannel.1 mesh on %d not complete after 90s: %s", port, strings.Join(why, "; "))
		}
		time.Sleep(time.Second)
	}
}

// annotations checks the Node annotations flanneld's subnet manager wrote.
func (f *fl) annotations() {
	f.t.Helper()
	for _, n := range f.c.Nodes {
		out := f.kubectl("get", "node", n.Name, "-o", "jsonpath={.metadata.annotations}")
		var a map[string]string
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			f.t.Fatalf("node %s annotations: %v: %s", n.Name, err, out)
		}
		for _, k := range []string{"backend-data", "backend-type", "kube-subnet-manager", "public-ip"} {
			if a["flannel.alpha.coreos.com/"+k] == "" {
				f.t.Errorf("node %s: no flannel.alpha.coreos.com/%s annotation (has %v)", n.Name, k, a)
			}
		}
		if bd := a["flannel.alpha.coreos.com/backend-data"]; !strings.Contains(bd, f.macs[n.Name]) {
			f.t.Errorf("node %s: backend-data %s does not name flannel.1's MAC %s", n.Name, bd, f.macs[n.Name])
		}
	}
}

// pods are the ring pods, one per node in node order, each checked to hold
// an address of its node's spec.podCIDR.
func (f *fl) pods() []cluster.PodEnd {
	f.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out := f.kubectl("get", "pods", "-l", "app=ring", "-o", `jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}`)
		byNode := map[string]netip.Addr{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			fs := strings.Fields(l)
			if len(fs) == 3 && fs[2] == "Running" {
				if a, err := netip.ParseAddr(fs[1]); err == nil {
					byNode[fs[0]] = a
				}
			}
		}
		var ends []cluster.PodEnd
		for _, n := range f.c.Nodes {
			ip, ok := byNode[n.Name]
			if !ok {
				break
			}
			cidr := f.kubectl("get", "node", n.Name, "-o", "jsonpath={.spec.podCIDR}")
			if p, err := netip.ParsePrefix(cidr); err != nil || !p.Contains(ip) {
				f.t.Fatalf("ring pod on %s has %s, outside the node's podCIDR %q", n.Name, ip, cidr)
			}
			ns, err := n.PodNetns(context.Background(), ip)
			if err != nil {
				// The API may still show a pod a rebooted node lost.
				if time.Now().After(deadline) {
					f.t.Fatal(err)
				}
				break
			}
			ends = append(ends, cluster.PodEnd{Node: n, Netns: ns, IP: ip})
		}
		if len(ends) == len(f.c.Nodes) {
			return ends
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no running ring pod on every node after 2m:\n%s", out)
		}
		time.Sleep(time.Second)
	}
}

// run measures the ring while do runs (or for settle alone when do is
// nil), then checks every node's port (port > 0) and that each node's MAC
// is the one flanneld first gave it, records the phase and returns the
// packets lost; with zero, any packet lost fails the test. port < 0: the
// ports are only recorded.
func (f *fl) run(name string, settle time.Duration, do func(), port int, zero bool) int {
	f.t.Helper()
	ring, err := cluster.StartPodRing(f.pods(), ringInterval)
	if err != nil {
		f.t.Fatal(err)
	}
	begin := time.Now()
	time.Sleep(settle)
	if do != nil {
		do()
		time.Sleep(settle)
	}
	pairs, err := ring.StopPods()
	if err != nil {
		f.t.Fatal(err)
	}
	ph := phase{Name: name, Seconds: time.Since(begin).Round(time.Millisecond).Seconds(), Ring: pairs, Ports: map[string]int{}, MACs: map[string]string{}}
	for _, p := range pairs {
		ph.Lost += p.Lost
	}
	for _, n := range f.c.Nodes {
		d := f.device(n)
		ph.Ports[n.Name], ph.MACs[n.Name] = d.Port, d.MAC
		if port > 0 && d.Port != port {
			f.t.Errorf("%s: node %s: flannel.1 dstport %d, want %d (read from the node's kernel)", name, n.Name, d.Port, port)
		}
		if want := f.macs[n.Name]; port > 0 && want != "" && d.MAC != want {
			f.t.Errorf("%s: node %s: flannel.1 MAC %s, was %s", name, n.Name, d.MAC, want)
		}
	}
	f.res.Phases = append(f.res.Phases, ph)
	f.t.Logf("%s: %d lost in %.1fs: %+v ports %v", name, ph.Lost, ph.Seconds, pairs, ph.Ports)
	if zero && ph.Lost != 0 {
		f.t.Errorf("%s: %d pod-to-pod packets lost, want 0: %+v", name, ph.Lost, pairs)
	}
	return ph.Lost
}

func (f *fl) flannelPod(n *cluster.Node) (name string, ready bool) {
	out := f.kubectl("-n", "kube-flannel", "get", "pods", "-l", "app=flannel", "--field-selector", "spec.nodeName="+n.Name,
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{"\n"}{end}`)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		fs := strings.Fields(l)
		if len(fs) == 2 {
			return fs[0], fs[1] == "true"
		}
	}
	return "", false
}

// restartFlanneld deletes the node's flanneld pod and waits for its
// replacement to be ready.
func (f *fl) restartFlanneld(n *cluster.Node) {
	f.t.Helper()
	old, _ := f.flannelPod(n)
	f.kubectl("-n", "kube-flannel", "delete", "pod", old, "--wait=true")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if name, ready := f.flannelPod(n); name != "" && name != old && ready {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no ready flanneld on %s 2m after deleting %s", n.Name, old)
		}
		time.Sleep(time.Second)
	}
}

// nextStepCommands finds, in kubectl cutover's output, the report's next
// step that restarts flanneld for port and returns its commands (the
// step's command line, split at " && "), each a kubectl command line.
func nextStepCommands(t *testing.T, out string, port int) []string {
	t.Helper()
	steps := printedNextSteps(out)
	if len(steps) == 0 {
		t.Fatalf("kubectl cutover printed no next steps: a running flanneld keeps the old port in memory, the admin must be told to restart it\n%s", out)
	}
	for _, st := range steps {
		if !strings.Contains(st.text, "restart flanneld") {
			continue
		}
		if !strings.Contains(st.text, fmt.Sprintf("Backend.Port %d", port)) {
			t.Errorf("the flanneld step does not name port %d: %s", port, st.text)
		}
		if len(st.cmds) != 1 {
			t.Fatalf("the flanneld step prints %d command lines, want one: %+v", len(st.cmds), st)
		}
		cmds := strings.Split(st.cmds[0], " && ")
		for _, c := range cmds {
			if !strings.HasPrefix(c, "kubectl ") {
				t.Fatalf("next step command %q is not a kubectl command line", c)
			}
		}
		return cmds
	}
	t.Fatalf("the next steps name no flanneld restart: %+v", steps)
	return nil
}

// runPrinted runs the kubectl command lines kubectl cutover printed, as
// the admin pastes them: every flanneld restarted, one node at a time.
func (f *fl) runPrinted(cmds []string) {
	f.t.Helper()
	if len(cmds) == 0 {
		f.t.Fatal("no printed command to run")
	}
	for _, c := range cmds {
		f.kubectl(strings.Fields(strings.TrimPrefix(c, "kubectl "))...)
	}
}

// join adds a node after the cutover, before any flanneld restarted: it
// gets its device from net-conf.json; the old nodes' flanneld add its
// entries on the device they cached at their start. restart is the
// flanneld restart the cutover printed: the repair.
func (f *fl) join(restart []string) {
	t := f.t
	t.Helper()
	n, err := f.c.AddNode(context.Background())
	if err != nil {
		t.Fatalf("join %s: %v", n.Name, err)
	}
	f.kubectl("-n", "kube-flannel", "rollout", "status", "ds/kube-flannel-ds", "--timeout=180s")
	// The harness gives every node a bridge configuration so that it is
	// Ready without a CNI daemon; a real flannel node stays NotReady until
	// flannel's install-cni wrote 10-flannel.conflist. A ring pod the new
	// node started before that is on the harness's bridge: start it again.
	f.kubectl("delete", "pods", "-l", "app=ring", "--field-selector", "spec.nodeName="+n.Name, "--wait=true")
	f.kubectl("rollout", "status", "ds/ring", "--timeout=180s")
	d := f.device(n)
	f.macs[n.Name] = d.MAC
	if d.Port != 4889 {
		t.Errorf("node %s joined after the cutover: flannel.1 on %d, want 4889 (net-conf.json)", n.Name, d.Port)
	}
	// The old nodes' flanneld add the new lease's neighbour, FDB entry and
	// route on the device they cached at start, each call retried with
	// backoff (about 50 s) before "AddARP failed" and the lease skipped.
	var failed []string
	for deadline := time.Now().Add(150 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Second) {
		failed = failed[:0]
		logs := f.kubectl("-n", "kube-flannel", "logs", "-l", "app=flannel", "--tail=-1", "--prefix")
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "AddARP failed") || strings.Contains(l, "AddFDB failed") || strings.Contains(l, "failed to add vxlanRoute") {
				failed = append(failed, strings.TrimSpace(l))
			}
		}
		if len(failed) >= len(f.c.Nodes)-1 {
			break
		}
	}
	var missing []string
	for _, o := range f.c.Nodes[:len(f.c.Nodes)-1] {
		if od := f.device(o); od.FDB[d.MAC] != n.IP().String() {
			missing = append(missing, o.Name)
		}
	}
	lost := f.run(fmt.Sprintf("%s joined after the cutover, no flanneld restarted", n.Name), 2*time.Second, nil, -1, false)
	if len(missing) > 0 || lost > 0 {
		f.finding(fmt.Sprintf("%s joined after the cutover (flanneld not restarted since): its device on %d; nodes without its FDB entry: %v; %d ring packets lost in 2 s; flanneld: %s", n.Name, d.Port, missing, lost, strings.Join(failed, " | ")))
		if len(missing) == 0 || len(failed) == 0 || lost == 0 {
			t.Errorf("join: the nodes that missed %s's entries (%v), flanneld's errors (%d) and the lost packets (%d) disagree", n.Name, missing, len(failed), lost)
		}
	} else {
		f.finding(fmt.Sprintf("%s joined after the cutover with no flanneld restarted: device on %d, every node has its FDB entry, 0 lost", n.Name, d.Port))
	}
	// The repair: the old nodes reach the new one as each restarts.
	f.run("rolling flanneld restart after the join (repairs it)", time.Second, func() { f.runPrinted(restart) }, 4889, false)
	f.run(n.Name+" after the rolling restart", 2*time.Second, nil, 4889, true)
}

func (f *fl) deleteDevice(n *cluster.Node) {
	f.t.Helper()
	if _, err := n.Exec(context.Background(), "ip", "link", "del", "flannel.1"); err != nil {
		f.t.Fatal(err)
	}
	var d cluster.FlannelDevice
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if d, err = n.Flannel(context.Background()); err == nil && d.MAC != "" {
			break
		}
		if time.Now().After(deadline) {
			f.finding(fmt.Sprintf("flannel.1 deleted on %s under a running flanneld: not recreated within 30s (%v)", n.Name, err))
			break
		}
	}
	if err == nil {
		f.finding(fmt.Sprintf("flannel.1 deleted on %s under a flanneld started before the cutover (ConfigMap now 4889): flanneld recreated it on %d, MAC %s (was %s), %d FDB entries, %d neighbours", n.Name, d.Port, d.MAC, f.macs[n.Name], len(d.FDB), len(d.Neigh)))
	}
	f.restartFlanneld(n)
	f.waitMesh(4889)
}

// reboot reboots n after the cutover: flanneld builds its device from
// net-conf.json (4889) with the MAC of its Node annotation.
func (f *fl) reboot(n *cluster.Node) {
	f.t.Helper()
	if err := n.Reboot(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.kubectl("-n", "kube-flannel", "rollout", "status", "ds/kube-flannel-ds", "--timeout=180s")
	f.kubectl("rollout", "status", "ds/ring", "--timeout=180s")
	f.waitMesh(4889)
	f.run(n.Name+" rebooted after the cutover", 2*time.Second, nil, 4889, true)
}
