package cluster_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/cluster"
)

// bootFirewall is a default-deny INPUT as a hardened node boots with it:
// the cluster's own ports and the overlay port the node was installed
// with (the admin's persisted rules), nothing Cutover opened since.
var bootFirewall = []string{
	"-F INPUT",
	"-P INPUT DROP",
	"-A INPUT -i lo -j ACCEPT",
	"-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
	"-A INPUT -p icmp -j ACCEPT",
	"-A INPUT -p tcp -m multiport --dports 9443,9444,9446,9447,10250,10256 -j ACCEPT",
	"-A INPUT -p udp --dport 9445 -j ACCEPT",
	"-A INPUT -p udp --dport 8472 -j ACCEPT",
}

func iptables(t *testing.T, n *cluster.Node, rules ...string) {
	t.Helper()
	for _, r := range rules {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", n.Netns, "iptables", "-w"}, strings.Fields(r)...)...).CombinedOutput(); err != nil {
			t.Fatalf("node %s: iptables %s: %v: %s", n.Name, r, err, out)
		}
	}
}

// pings sends count pings from node from to node to's pod gateway across
// the overlay and returns how many were answered.
func pings(from, to *cluster.Node, count int) int {
	out, _ := exec.Command("ip", "netns", "exec", from.Netns, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1",
		cluster.GatewayIP(to.Index).String()).CombinedOutput()
	m := regexp.MustCompile(`(\d+) received`).FindStringSubmatch(string(out))
	if m == nil {
		return 0
	}
	var n int
	fmt.Sscan(m[1], &n)
	return n
}

// reboot plays a node reboot after a cutover to port: its firewall back to
// the hardened boot rules (which name the install-time port only), its
// flannel.1 recreated on the configured port as flanneld does at start,
// its agent pod restarted. Before the agent is back the node is cut off
// (the boot firewall drops the overlay's port): that is what the agent's
// start-up opening exists for, and the test shows it both ways.
func (e *e2e) reboot(t *testing.T, n *cluster.Node, port int) {
	prev := e.c.Nodes[(n.Index-2+len(e.c.Nodes))%len(e.c.Nodes)]
	next := e.c.Nodes[n.Index%len(e.c.Nodes)]
	defer iptables(t, n, "-P INPUT ACCEPT")
	cutOff := false
	for try := 0; try < 3 && !cutOff; try++ {
		iptables(t, n, bootFirewall...)
		if err := n.KernelDevice(context.Background(), port, false); err != nil {
			t.Fatal(err)
		}
		// The running agent re-checks its rule every minute; a check that
		// lands in this window reopens the port before the reboot's agent
		// does, and the cut-off is retried.
		cutOff = pings(prev, n, 3) == 0
	}
	if !cutOff {
		t.Fatalf("node %s answered across the overlay behind the boot firewall before its agent restarted: the test cannot show the cut-off", n.Name)
	}
	e.kubectl("-n", "cutover", "delete", "pod", "-l", "app.kubernetes.io/name=cutover-agent", "--field-selector", "spec.nodeName="+n.Name)
	e.waitRollout()
	deadline := time.Now().Add(60 * time.Second)
	for pings(prev, n, 3) < 3 || pings(n, next, 3) < 3 {
		if time.Now().After(deadline) {
			out, _ := n.Exec(context.Background(), "iptables", "-S", "INPUT")
			t.Fatalf("node %s rebooted behind a default-deny firewall: its peers still cannot reach it across the overlay on %d a minute after its agent restarted\n%s", n.Name, port, out)
		}
	}
	e.wantKernelPortsT(t, port)
}

// badInput: what a user gets wrong on this path gets a clear error and
// changes nothing.
func (e *e2e) badInput(t *testing.T, port int) {
	ctx := context.Background()
	t.Run("kubeconfig without rights", func(t *testing.T) {
		kc, err := e.c.UserKubeconfig("nobody")
		if err != nil {
			t.Fatal(err)
		}
		out, code := e.plugin(time.Minute, "--kubeconfig", kc, "plan", "--port", "4999")
		if code == 0 || !strings.Contains(out, "forbidden") {
			t.Errorf("plan with a kubeconfig that may read nothing: exit %d, want non-zero naming what is forbidden\n%s", code, out)
		}
		e.wantKernelPortsT(t, port)
	})
	t.Run("image missing on a node", func(t *testing.T) {
		n := e.c.Nodes[2]
		imgs, err := n.Images()
		if err != nil {
			t.Fatal(err)
		}
		for _, ref := range imgs {
			if strings.HasPrefix(ref, agentRepo+":") || strings.HasPrefix(ref, agentRepo+"@") {
				if err := n.RemoveImage(ref); err != nil {
					t.Fatal(err)
				}
			}
		}
		e.kubectl("-n", "cutover", "delete", "pod", "-l", "app.kubernetes.io/name=cutover-agent", "--field-selector", "spec.nodeName="+n.Name, "--wait=false")
		time.Sleep(3 * time.Second)
		out, code := e.plugin(2*time.Minute, "plan", "--port", "4999")
		if code != 4 || !strings.Contains(out, n.Name) {
			t.Errorf("plan with node %s's agent image missing: exit %d, want 4 naming %s\n%s", n.Name, code, n.Name, out)
		}
		e.wantKernelPortsT(t, port)
		if err := n.ImportImage(ctx, e.im.agentV2); err != nil {
			t.Fatal(err)
		}
		e.kubectl("-n", "cutover", "delete", "pod", "-l", "app.kubernetes.io/name=cutover-agent", "--field-selector", "spec.nodeName="+n.Name)
		e.waitRollout()
	})
	t.Run("no coordinator running", func(t *testing.T) {
		e.kubectl("-n", "cutover", "scale", "deploy/cutover-coordinator", "--replicas=0")
		e.kubectl("-n", "cutover", "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=cutover-coordinator", "--timeout=120s")
		out, code := e.plugin(time.Minute, "plan", "--port", "4999")
		if code == 0 || !strings.Contains(out, "coordinator") {
			t.Errorf("plan with no coordinator running: exit %d, want non-zero naming the coordinator\n%s", code, out)
		}
		e.kubectl("-n", "cutover", "scale", "deploy/cutover-coordinator", "--replicas=2")
		e.waitRollout()
		e.waitLeader(t, "")
		e.wantKernelPortsT(t, port)
	})
	t.Run("leader lost mid-command", func(t *testing.T) {
		leader := e.waitLeader(t, "")
		back := 8472
		type res struct {
			out  string
			code int
		}
		done := make(chan res, 1)
		go func() {
			out, code := e.plugin(3*time.Minute, "cutover", "--port", fmt.Sprint(back), "--allow-tunnel-port")
			done <- res{out, code}
		}()
		time.Sleep(1500 * time.Millisecond)
		e.kubectl("-n", "cutover", "delete", "pod", leader, "--grace-period=1", "--wait=false")
		r := <-done
		if r.code == 0 {
			t.Logf("the cutover finished before its leader went (exit 0): the leader was deleted too late to test this")
		} else if r.code != 6 && r.code != 3 {
			t.Errorf("kubectl cutover with its leader deleted mid-operation: exit %d, want 6 (stream ended) or 3 (unreachable)\n%s", r.code, r.out)
		}
		e.waitLeader(t, leader)
		e.waitRollout()
		// The new leader resumes or rolls back the journal: one port
		// everywhere (I1), and the source of truth agrees.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, code := e.plugin(time.Minute, "status")
			if (code == 0 || code == 1) && !strings.Contains(out, "RUNNING") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the operation is not over 2 minutes after its leader was deleted:\n%s", out)
			}
			time.Sleep(2 * time.Second)
		}
		ports := e.kernelPorts()
		first := ports[e.c.Nodes[0].Name]
		for n, p := range ports {
			if p != first {
				t.Fatalf("after the leader was lost the nodes disagree: %v (I1)", ports)
			}
			_ = n
		}
		if p := e.flannelPort(); p != first {
			t.Errorf("kube-flannel-cfg Backend.Port %d, the nodes are on %d", p, first)
		}
		t.Logf("leader lost mid-command: exit %d, every node on %d", r.code, first)
		e.lastPort = first
	})
}

// uninstall: nothing in flight, the manifests deleted, each node cleaned
// with the agent's cleanup; then no node holds a rule, device or file
// Cutover made, and the overlay still carries traffic.
func (e *e2e) uninstall(t *testing.T) {
	ctx := context.Background()
	out, code := e.plugin(time.Minute, "status")
	if code != 0 && code != 1 || strings.Contains(out, "RUNNING") {
		t.Fatalf("before uninstalling, status must show no operation in flight: exit %d\n%s", code, out)
	}
	e.kubectl("delete", "-f", e.manifest, "--wait=true", "--timeout=180s")
	for _, n := range e.c.Nodes {
		// docs/install.md, Uninstall, step 3, as written: the release's
		// agent image run once on the node.
		out, err := n.Ctr(ctx, "run", "--rm", "--privileged", "--net-host",
			"--mount", "type=bind,src=/var/lib/cutover,dst=/var/lib/cutover,options=rbind:rw",
			e.agentRef, "cutover-cleanup",
			"/usr/local/bin/cutover-agent", "cleanup", "--backend=kernel-vxlan", "--kernel-device=flannel.1", "--firewall-chain=INPUT")
		if err != nil {
			t.Fatalf("node %s: cutover-agent cleanup: %v\n%s", n.Name, err, out)
		}
		t.Logf("node %s: cleanup:\n%s", n.Name, out)
		rules, _ := n.Exec(ctx, "iptables-save")
		for _, l := range strings.Split(rules, "\n") {
			if strings.Contains(strings.ToLower(l), "cutover") {
				t.Errorf("node %s: a rule Cutover made is left after uninstall: %s", n.Name, l)
			}
		}
		links, _ := n.Exec(ctx, "ip", "-o", "link", "show")
		for _, l := range strings.Split(links, "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "cot") {
				t.Errorf("node %s: a device Cutover made is left after uninstall: %s", n.Name, l)
			}
		}
		if ents, _ := os.ReadDir(n.HostPath("/var/lib/cutover")); len(ents) > 0 {
			t.Errorf("node %s: /var/lib/cutover holds %d entries after uninstall", n.Name, len(ents))
		}
	}
	for i, n := range e.c.Nodes {
		next := e.c.Nodes[(i+1)%len(e.c.Nodes)]
		if got := pings(n, next, 3); got < 3 {
			t.Errorf("after uninstall %s reaches %s across the overlay %d of 3 times", n.Name, next.Name, got)
		}
	}
}

// saveResults writes the test's figures into $COT_CLUSTER_RESULTS (a
// directory: make cluster-e2e sets results/) as cluster_e2e_<overlay>.json,
// with their provenance.
func (e *e2e) saveResults(t *testing.T) {
	dir := os.Getenv("COT_CLUSTER_RESULTS")
	if dir == "" {
		return
	}
	t.Setenv(benchresult.EnvDir, dir)
	benchresult.Save(t, "cluster_e2e_"+strings.ToLower(strings.TrimPrefix(t.Name(), "TestInstall"))+".json", e.res)
}
