package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cutover-dev/cutover/harness/cluster"
	"github.com/cutover-dev/cutover/harness/image"
	"github.com/cutover-dev/cutover/harness/sdnsim"
)

// sdnRef is the SDN stand-in's image on the nodes, named as OpenShift
// 3.11's node image so that the DaemonSet reads as the real one.
const sdnRef = "registry.example/openshift3/ose-node:v3.11"

// buildSDNImage is openshift-sdn's node image as far as the VXLAN port
// goes: harness/sdnsim (which reads the ClusterNetwork at start, rebuilds
// br0 when it is not set up for that port, owns the SDN's iptables chains
// and exits on a failed health check) on the agent image's Debian root,
// which carries the ovs-vsctl, ovs-ofctl, iptables and ip it runs.
func buildSDNImage(t *testing.T, im e2eImages) string {
	t.Helper()
	bin := filepath.Join(im.dir, "sdnsim")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./harness/sdnsim/cmd/sdnsim")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sdnsim: %v\n%s", err, out)
	}
	s := image.Agent(sdnRef, "v3.11", "amd64", im.bin, filepath.Join(debsDir(), "amd64", "packages.txt"))
	s.Entrypoint = []string{"/usr/bin/openshift-sdn"}
	s.Files = append(s.Files, image.File{Path: "/usr/bin/openshift-sdn", Mode: 0o755, Src: bin})
	img, err := image.Image(s)
	if err != nil {
		t.Fatalf("SDN image (make agent-debs fills the package cache it needs): %v", err)
	}
	out := filepath.Join(im.dir, "ose-node.tar")
	if _, err := image.WriteOCI(out, sdnRef, img); err != nil {
		t.Fatal(err)
	}
	return out
}

// debsDir is hack/agent-debs.sh's cache, where the release's image tool
// finds it too.
func debsDir() string {
	if d := os.Getenv("CUTOVER_CACHE_DIR"); d != "" {
		return filepath.Join(d, "debs")
	}
	d, _ := os.UserCacheDir()
	return filepath.Join(d, "cutover", "debs")
}

// sdnManifest is openshift-sdn's side of a 3.11 cluster as far as Cutover
// meets it: the namespace, the sdn DaemonSet (app=sdn, container sdn, host
// network, privileged, the node's /var/run/openvswitch) and the rights its
// pods use to read the ClusterNetwork.
const sdnManifest = `apiVersion: v1
kind: Namespace
metadata: {name: openshift-sdn}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: sdn, namespace: openshift-sdn}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: openshift-sdn}
rules:
- apiGroups: [network.openshift.io]
  resources: [clusternetworks]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: openshift-sdn}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: openshift-sdn}
subjects:
- {kind: ServiceAccount, name: sdn, namespace: openshift-sdn}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: sdn, namespace: openshift-sdn}
spec:
  selector: {matchLabels: {app: sdn}}
  template:
    metadata: {labels: {app: sdn}}
    spec:
      serviceAccountName: sdn
      hostNetwork: true
      terminationGracePeriodSeconds: 5
      containers:
      - name: sdn
        image: ` + sdnRef + `
        imagePullPolicy: Never
        args: [--node=$(NODE_NAME), --ovs-dir=/var/run/openvswitch]
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        securityContext: {privileged: true}
        volumeMounts:
        - {name: ovs, mountPath: /var/run/openvswitch}
        - {name: xtables-lock, mountPath: /run/xtables.lock}
      volumes:
      - name: ovs
        hostPath: {path: /var/run/openvswitch}
      - name: xtables-lock
        hostPath: {path: /run/xtables.lock, type: FileOrCreate}
`

// pdbV1 is the one change the test makes to the openshift release
// manifest: its PodDisruptionBudget is policy/v1beta1, for OpenShift 3.11
// (Kubernetes 1.11, which serves no policy/v1); the tier's Kubernetes
// 1.35 serves only policy/v1. Nothing else in the manifest changes.
const pdbV1 = `- target: {kind: PodDisruptionBudget, name: cutover-coordinator}
  patch: |-
    - op: replace
      path: /apiVersion
      value: policy/v1`

// TestInstallOpenShift installs Cutover's openshift release manifest
// (SCCs, the openshift-sdn profile on the agents, the coordinator's
// source-of-truth-first hook, the ConfigMap leader lock) onto a real
// cluster whose nodes run an openshift-sdn-shaped userspace Open vSwitch
// overlay, with the SDN stand-in as the real sdn DaemonSet reading a
// ClusterNetwork from the apiserver, and drives plan, cutover and rollback
// through kubectl cutover: every node's vxlan0, drop flow and SDN firewall
// rule read from the node, the ClusterNetwork, the SDN pods restarted
// without rebuilding br0, and the ring across the overlay bounded.
func TestInstallOpenShift(t *testing.T) {
	cluster.Require(t)
	im := buildImages(t, "v0.0.0-e2e")
	sdnImage := buildSDNImage(t, im)
	e := startCluster(t, im, 4789, sdnImage)
	e.res.TierUpMs = benchMs(e.c.StartupTime)
	defer func() { e.saveResults(t) }()

	// OpenShift's API as far as the manifest and the hook use it: the
	// SCC and ClusterNetwork kinds (stand-in CRDs, OpenShift's own are in
	// no module served here), ClusterNetwork "default" on 4789, and the
	// SDN running on every node.
	scc := filepath.Join(repoRoot(t), "deploy", "testdata", "crds", "securitycontextconstraints.yaml")
	cn := filepath.Join(e.dir, "clusternetwork-crd.yaml")
	if err := os.WriteFile(cn, []byte(sdnsim.ClusterNetworkCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubectl("apply", "-f", scc, "-f", cn)
	e.kubectl("wait", "--for=condition=established", "--timeout=60s",
		"crd/securitycontextconstraints.security.openshift.io", "crd/clusternetworks.network.openshift.io")
	obj, err := json.Marshal(sdnsim.NewClusterNetwork(4789, cluster.PodCIDR.String()).Object)
	if err != nil {
		t.Fatal(err)
	}
	sdn := filepath.Join(e.dir, "sdn.yaml")
	if err := os.WriteFile(sdn, []byte(sdnManifest+"---\n"+string(obj)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubectl("apply", "-f", sdn)
	e.kubectl("-n", "openshift-sdn", "rollout", "status", "ds/sdn", "--timeout=180s")
	e.wantSDN(t, 4789, nil)

	installStart := time.Now()
	e.install("overlays/openshift", pdbV1)
	e.res.InstallMs = benchMs(time.Since(installStart))
	t.Log(e.kubectl("-n", "cutover", "get", "pods", "-o", "wide"))
	if _, err := e.c.Kubectl(context.Background(), "-n", "cutover", "get", "lease", "cutover-coordinator"); err == nil {
		t.Fatal("the coordinator holds a Lease although the openshift overlay runs --leader-lock=configmap")
	}
	step := func(name string, fn func(t *testing.T)) {
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	step("plan", func(t *testing.T) {
		out, code := e.plugin(2*time.Minute, "plan", "--port", "4889")
		if code != 0 || !strings.Contains(out, "may go") {
			t.Fatalf("kubectl cutover plan --port 4889: exit %d, want 0 and \"may go\"\n%s", code, out)
		}
		if !strings.Contains(out, "ClusterNetwork default") {
			t.Errorf("the plan does not say what happens to ClusterNetwork default (the SDN hook's lines):\n%s", out)
		}
		e.wantKernelPortsT(t, 4789)
	})
	for _, c := range []struct {
		verb string
		to   int
	}{{"cutover", 4889}, {"rollback", 4789}} {
		step(c.verb, func(t *testing.T) {
			before := e.sdnPods(t)
			out := e.change(t, c.verb, c.to)
			e.wantSDN(t, c.to, before)
			// The masters' file is out of the API's reach: the admin must
			// read that it is theirs to change, in what kubectl cutover
			// printed, not in the coordinator's log.
			want := fmt.Sprintf("networkConfig.vxlanPort: %d in /etc/origin/master/master-config.yaml", c.to)
			found := false
			for _, st := range printedNextSteps(out) {
				found = found || strings.Contains(st.text, want)
			}
			if !found {
				t.Errorf("kubectl cutover %s printed no next step %q\n%s", c.verb, want, out)
			}
		})
	}
}

// sdnPods maps node to the UID of its SDN pod.
func (e *e2e) sdnPods(t *testing.T) map[string]string {
	t.Helper()
	cs, err := e.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoreV1().Pods("openshift-sdn").List(context.Background(), metav1.ListOptions{LabelSelector: "app=sdn"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = string(p.UID)
		}
	}
	return out
}

// wantSDN checks openshift-sdn's side after the overlay moved to port:
// ClusterNetwork "default" says port (the SDN's source of truth, so a
// restart builds onto it); on every node the SDN's pod runs, started after
// the change when before (the pods before it) is given, and found br0
// already set up for port (it never rebuilt br0: a rebuild tears every
// pod's flows down); and the node's drop flow and SDN firewall rule name
// port and nothing else.
func (e *e2e) wantSDN(t *testing.T, port int, before map[string]string) {
	t.Helper()
	ctx := context.Background()
	out := e.kubectl("get", "clusternetwork", "default", "-o", "jsonpath={.vxlanPort}")
	if out != fmt.Sprint(port) {
		t.Errorf("ClusterNetwork default vxlanPort %q, want %d", out, port)
	}
	now := e.sdnPods(t)
	if len(now) != len(e.c.Nodes) {
		t.Errorf("SDN pods on %d nodes (%v), want every one of %d", len(now), now, len(e.c.Nodes))
	}
	for node, uid := range now {
		if before != nil && before[node] == uid {
			t.Errorf("node %s: the SDN pod %s was not restarted by the change: the SDN still runs on the port it read before", node, uid)
		}
	}
	// Every SDN pod's log since it started: a "start port=P setup=already"
	// and no rebuild.
	e.kubectl("-n", "openshift-sdn", "rollout", "status", "ds/sdn", "--timeout=120s")
	logs := e.kubectl("-n", "openshift-sdn", "logs", "-l", "app=sdn", "--tail=-1", "--prefix")
	starts := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "EVENT rebuild") {
			t.Errorf("an SDN pod rebuilt br0: %s", l)
		}
		if strings.Contains(l, "EVENT start ") {
			starts++
			if !strings.Contains(l, fmt.Sprintf("port=%d setup=already", port)) {
				t.Errorf("an SDN pod started otherwise than on port %d with br0 already set up: %s", port, l)
			}
		}
	}
	if starts < len(e.c.Nodes) {
		t.Errorf("%d SDN start lines in the logs, want one per node (%d):\n%s", starts, len(e.c.Nodes), logs)
	}
	for _, n := range e.c.Nodes {
		drop, allow, err := n.SDNPorts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(drop, []int{port}) {
			t.Errorf("node %s: br0 table 20 drops pod traffic to UDP ports %v, want [%d] (read from the node's OVS)", n.Name, drop, port)
		}
		if !slices.Equal(allow, []int{port}) {
			t.Errorf("node %s: OPENSHIFT-FIREWALL-ALLOW accepts UDP ports %v, want [%d] (read from the node's iptables)", n.Name, allow, port)
		}
	}
}
