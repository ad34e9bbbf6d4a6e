package cluster

// The real flannel on the cluster: flanneld (built from its module by
// hack/flannel-tools.sh) as its DaemonSet with the Kubernetes subnet
// manager, pods wired by a stand-in for flannel's CNI plugin (flannelcni),
// and what a test reads back from a node: flannel.1's MAC, FDB and
// neighbour entries, a pod's network namespace.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/harness/kubetest"
)

// FlannelVersion is the flanneld hack/flannel-tools.sh builds.
const FlannelVersion = "v0.28.10"

// FlanneldPath is the cached flanneld.
func FlanneldPath() string { return filepath.Join(kubetest.CacheDir(), "flanneld-"+FlannelVersion) }

// FlannelManifest is flannel's release manifest (Documentation/kube-flannel.yml
// of FlannelVersion) for this cluster: its Namespace, RBAC, ServiceAccount,
// kube-flannel-cfg (net-conf.json: PodCIDR, vxlan, Backend.Port port) and
// the DaemonSet running image with --kube-subnet-mgr. Differences from
// upstream, each because of the tier: the images are one (flanneld and the
// CNI stand-in at /flannel; there is no registry), the init containers copy
// with cp (upstream's install-conf is a copy too), --iface=eth0 (each node
// has one underlay), and the container is privileged.
func FlannelManifest(image string, port int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: kube-flannel
  labels: {k8s-app: flannel, pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: flannel
  labels: {k8s-app: flannel}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: flannel
  labels: {k8s-app: flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flannel}
subjects:
- {kind: ServiceAccount, name: flannel, namespace: kube-flannel}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: flannel
  namespace: kube-flannel
  labels: {k8s-app: flannel}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-flannel-cfg
  namespace: kube-flannel
  labels: {tier: node, k8s-app: flannel, app: flannel}
data:
  cni-conf.json: |
    {
      "name": "cbr0",
      "cniVersion": "1.0.0",
      "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
        {"type": "portmap", "capabilities": {"portMappings": true}}
      ]
    }
  net-conf.json: |
    %s
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-flannel-ds
  namespace: kube-flannel
  labels: {tier: node, app: flannel, k8s-app: flannel}
spec:
  selector:
    matchLabels: {app: flannel}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata:
      labels: {tier: node, app: flannel}
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists, effect: NoSchedule}]
      serviceAccountName: flannel
      initContainers:
      - name: install-cni-plugin
        image: %[2]s
        imagePullPolicy: Never
        command: [cp, -f, /flannel, /opt/cni/bin/flannel]
        volumeMounts: [{name: cni-plugin, mountPath: /opt/cni/bin}]
      - name: install-cni
        image: %[2]s
        imagePullPolicy: Never
        command: [cp, -f, /etc/kube-flannel/cni-conf.json, /etc/cni/net.d/10-flannel.conflist]
        volumeMounts:
        - {name: cni, mountPath: /etc/cni/net.d}
        - {name: flannel-cfg, mountPath: /etc/kube-flannel/}
      containers:
      - name: kube-flannel
        image: %[2]s
        imagePullPolicy: Never
        command: [/opt/bin/flanneld]
        args: [--ip-masq, --kube-subnet-mgr, --iface=eth0, --healthz-port=8081]
        readinessProbe:
          httpGet: {path: /readyz, port: 8081, host: 127.0.0.1}
          periodSeconds: 2
        securityContext: {privileged: true}
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: EVENT_QUEUE_DEPTH, value: "5000"}
        - {name: CONT_WHEN_CACHE_NOT_READY, value: "false"}
        volumeMounts:
        - {name: run, mountPath: /run/flannel}
        - {name: flannel-cfg, mountPath: /etc/kube-flannel/}
        - {name: xtables-lock, mountPath: /run/xtables.lock}
      volumes:
      - {name: run, hostPath: {path: /run/flannel}}
      - {name: cni-plugin, hostPath: {path: /opt/cni/bin}}
      - {name: cni, hostPath: {path: /etc/cni/net.d}}
      - {name: flannel-cfg, configMap: {name: kube-flannel-cfg}}
      - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
`, FlannelNetConf(port), image)
}

// FlannelNetConf is net-conf.json for this cluster with Backend.Port port.
func FlannelNetConf(port int) string {
	return fmt.Sprintf(`{"Network": %q, "EnableNFTables": false, "Backend": {"Type": "vxlan", "Port": %d}}`, PodCIDR.String(), port)
}

// FlannelDevice is flannel.1 as the node's kernel has it.
type FlannelDevice struct {
	Port    int
	MAC     string
	Ifindex int
	// FDB maps each remote VTEP MAC to its destination node address;
	// Neigh each peer's flannel.1 address to its MAC.
	FDB   map[string]string
	Neigh map[string]string
}

// Flannel reads the node's flannel.1 from its kernel.
func (n *Node) Flannel(ctx context.Context) (FlannelDevice, error) {
	var d FlannelDevice
	out, err := run("ip", "-n", n.Netns, "-j", "-d", "link", "show", "flannel.1")
	if err != nil {
		return d, err
	}
	var links []struct {
		Ifindex  int    `json:"ifindex"`
		Address  string `json:"address"`
		LinkInfo struct {
			InfoData struct {
				Port int `json:"port"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		return d, fmt.Errorf("node %s: ip -j link show flannel.1: %w: %q", n.Name, err, out)
	}
	d.Port, d.MAC, d.Ifindex = links[0].LinkInfo.InfoData.Port, links[0].Address, links[0].Ifindex
	d.FDB, d.Neigh = map[string]string{}, map[string]string{}
	out, err = run("bridge", "-n", n.Netns, "-j", "fdb", "show", "dev", "flannel.1")
	if err != nil {
		return d, err
	}
	var fdb []struct{ Mac, Dst string }
	if err := json.Unmarshal([]byte(out), &fdb); err != nil {
		return d, fmt.Errorf("node %s: bridge -j fdb: %w", n.Name, err)
	}
	for _, e := range fdb {
		if e.Dst != "" {
			d.FDB[e.Mac] = e.Dst
		}
	}
	out, err = run("ip", "-n", n.Netns, "-j", "neigh", "show", "dev", "flannel.1")
	if err != nil {
		return d, err
	}
	var neigh []struct{ Dst, Lladdr string }
	if err := json.Unmarshal([]byte(out), &neigh); err != nil {
		return d, fmt.Errorf("node %s: ip -j neigh: %w", n.Name, err)
	}
	for _, e := range neigh {
		d.Neigh[e.Dst] = e.Lladdr
	}
	return d, nil
}

// PodNetns is the path, inside the node's mount namespace, of the network
// namespace whose eth0 holds ip (containerd's cni-*, PodNetnsDir).
func (n *Node) PodNetns(ctx context.Context, ip netip.Addr) (string, error) {
	out, err := n.Exec(ctx, "sh", "-c", `for f in `+n.PodNetnsDir()+`/cni-*; do echo "$f $(nsenter --net=$f ip -4 -o addr show dev eth0 2>/dev/null)"; done`)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		for i := range f {
			if i > 0 && f[i-1] == "inet" && strings.HasPrefix(f[i], ip.String()+"/") {
				return f[0], nil
			}
		}
	}
	return "", fmt.Errorf("node %s: no pod network namespace holds %s:\n%s", n.Name, ip, out)
}

// PodEnd is a pod the pod ring pings from and to.
type PodEnd struct {
	Node  *Node
	Netns string // PodNetns
	IP    netip.Addr
}

// StartPodRing pings from each pod to the next one's address (the last to
// the first), one ping every interval per pair, from inside the pods'
// network namespaces: pod-to-pod traffic across flannel.1.
func StartPodRing(pods []PodEnd, interval time.Duration) (*Ring, error) {
	r := &Ring{}
	for i, p := range pods {
		to := pods[(i+1)%len(pods)]
		if len(pods) < 2 {
			break
		}
		if err := r.start(p.Node.Name, to.Node.Name, p.Node.in("nsenter", "--net="+p.Netns, "--"), "", interval, to.IP.String()); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// PodRingPair is one direction of a pod ring, counted from ping's
// per-reply lines: Lost are the sequence numbers up to the last one
// answered that got no answer, so a request still in flight when the ring
// stopped is not counted as lost (Sent, ping's own count, includes it).
type PodRingPair struct {
	From, To       string
	Sent, Received int
	Lost           int
}

var icmpSeqRE = regexp.MustCompile(`bytes from [^:]+: icmp_seq=(\d+) `)

// StopPods stops a ring StartPodRing started and counts each pair.
func (r *Ring) StopPods() ([]PodRingPair, error) {
	r.halt()
	var out []PodRingPair
	var errs []error
	for _, p := range r.pairs {
		text := p.out.String()
		m := pingStatsRE.FindStringSubmatch(text)
		if m == nil {
			errs = append(errs, fmt.Errorf("pod ring %s->%s: no statistics in %q", p.from, p.to, lastLines(text, 5)))
			continue
		}
		rp := PodRingPair{From: p.from, To: p.to}
		rp.Sent, _ = strconv.Atoi(m[1])
		seen := map[int]bool{}
		last := 0
		for _, sm := range icmpSeqRE.FindAllStringSubmatch(text, -1) {
			n, _ := strconv.Atoi(sm[1])
			seen[n] = true
			last = max(last, n)
		}
		rp.Received = len(seen)
		rp.Lost = last - len(seen)
		if last == 0 {
			rp.Lost = rp.Sent
		}
		out = append(out, rp)
	}
	return out, errors.Join(errs...)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// AddNode starts one more node (the next index) through the same path Up
// starts its nodes, Config.Images imported, and returns once every node is
// Ready: a node joining a running cluster. Down stops it with the others.
func (c *Cluster) AddNode(ctx context.Context) (*Node, error) {
	n := &Node{c: c, Index: len(c.Nodes) + 1, Name: fmt.Sprintf("n%d", len(c.Nodes)+1)}
	c.Nodes = append(c.Nodes, n)
	if err := n.start(ctx); err != nil {
		return n, err
	}
	return n, c.waitNodesReady(ctx, 3*time.Minute)
}

// Reboot stops everything on the node and starts it again as a rebooted
// machine comes back: a fresh network namespace (every device, route,
// rule and socket gone), /run emptied (the node's run directory and
// /run/flannel, tmpfs on a real node), the disk kept (containerd's images,
// /var/lib/kubelet, /var/lib/cni, /etc/cni/net.d, /opt/cni/bin).
func (n *Node) Reboot(ctx context.Context) error {
	if err := n.stop(); err != nil {
		return fmt.Errorf("node %s: reboot: stop: %w", n.Name, err)
	}
	if _, err := run("ip", "netns", "delete", n.Netns); err != nil {
		return fmt.Errorf("node %s: reboot: %w", n.Name, err)
	}
	// The kernel frees a deleted namespace, and the veth pair with it,
	// asynchronously: the hub's end may still be there.
	_, _ = run("ip", "-n", n.c.Hub, "link", "del", "v-"+n.Name)
	for _, d := range []string{n.runDir(), n.HostPath("/run/flannel")} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("node %s: reboot: %w", n.Name, err)
		}
	}
	if err := n.start(ctx); err != nil {
		return fmt.Errorf("node %s: reboot: %w", n.Name, err)
	}
	return n.c.waitNodesReady(ctx, 3*time.Minute)
}
