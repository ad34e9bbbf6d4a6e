package cluster

import (
	"archive/tar"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// Node is one kubelet with its own network and mount namespaces.
type Node struct {
	c     *Cluster
	Name  string
	Index int
	// Netns is the node's network namespace: its eth0 on the hub bridge
	// at IP.
	Netns string

	holder, containerd, kubelet, kubeProxy *proc
	ovs                                    *ovsproc.Instance
}

// IP is the node's address (its InternalIP).
func (n *Node) IP() netip.Addr { return NodeIP(n.Index) }

// Dir holds the node's logs and the directories bound over its host paths.
func (n *Node) Dir() string { return filepath.Join(n.c.cfg.Dir, n.Name) }

// runDir holds the node's sockets (short paths).
func (n *Node) runDir() string { return filepath.Join("/run", n.c.cfg.Name, n.Name) }

func (n *Node) sock() string { return filepath.Join(n.runDir(), "containerd.sock") }

// PodNetnsDir is where the node's containerd mounts its pods' network
// namespaces (cni-*), seen inside the node's mount namespace (Exec).
func (n *Node) PodNetnsDir() string {
	return filepath.Join(n.runDir(), "state", "io.containerd.grpc.v1.cri", "netns")
}

// HostPaths are the paths a node owns, each bound in its mount namespace
// to a directory of its own under Dir/host.
var HostPaths = []string{
	"/var/lib/kubelet", "/etc/cni/net.d", "/opt/cni/bin", "/var/lib/cni",
	"/run/containerd", "/run/openvswitch", "/var/lib/cutover", "/run/flannel",
	"/var/log/pods", "/var/log/containers",
}

// HostPath is where node path p (one of HostPaths) lives on this machine.
func (n *Node) HostPath(p string) string { return filepath.Join(n.Dir(), "host", p) }

func (n *Node) cgroup() string { return "/" + n.c.cfg.Name + "-" + n.Name }

// cgroupHierarchies are the cgroup v1 hierarchies a kubelet wants its
// cgroupRoot in (it refuses to start when one lacks it).
var cgroupHierarchies = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd"}

func (n *Node) start(ctx context.Context) error {
	c := n.c
	n.Netns = c.cfg.Name + "-" + n.Name
	for _, d := range []string{n.Dir(), n.runDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := n.network(); err != nil {
		return fmt.Errorf("node %s: network: %w", n.Name, err)
	}
	if err := n.mountNamespace(); err != nil {
		return fmt.Errorf("node %s: mount namespace: %w", n.Name, err)
	}
	if c.cfg.OVSPort != 0 {
		if err := n.startOVS(ctx, c.cfg.OVSPort); err != nil {
			return fmt.Errorf("node %s: open vswitch: %w", n.Name, err)
		}
	}
	if err := n.cgroups(); err != nil {
		return fmt.Errorf("node %s: cgroups: %w", n.Name, err)
	}
	if err := n.cni(); err != nil {
		return fmt.Errorf("node %s: cni: %w", n.Name, err)
	}
	if err := n.startContainerd(ctx); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	for _, img := range c.cfg.Images {
		if err := n.ImportImage(ctx, img); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := n.startKubelet(); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := n.startKubeProxy(); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// network: eth0 on the hub bridge, the Service range on-link (kube-proxy
// rewrites it to the apiserver), and a blackhole default so that no packet
// to an address the cluster does not use leaves the node.
func (n *Node) network() error {
	if err := netns.Create(n.Netns); err != nil {
		return err
	}
	peer := "v-" + n.Name
	if err := ipBatch(n.c.Hub,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", peer, n.Netns),
		fmt.Sprintf("link set %s master br-cl up", peer),
	); err != nil {
		return err
	}
	return ipBatch(n.Netns,
		"addr add "+netip.PrefixFrom(n.IP(), NodeNet.Bits()).String()+" dev eth0",
		"link set eth0 up",
		"route add "+serviceRange()+" dev eth0",
		"route add blackhole default",
	)
}

// mountNamespace starts the process that holds the node's mount namespace:
// in the node's network namespace, with HostPaths bound to the node's own
// directories, and / recursively shared inside it (the kubelet wants
// mount propagation) but private from the host.
func (n *Node) mountNamespace() error {
	var script strings.Builder
	script.WriteString("set -e; mount --make-rshared /; ")
	for _, p := range HostPaths {
		src := n.HostPath(p)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
		fmt.Fprintf(&script, "mount --bind %s %s; ", src, p)
	}
	ready := filepath.Join(n.Dir(), "holder.ready")
	_ = os.Remove(ready)
	fmt.Fprintf(&script, "touch %s; exec sleep infinity", ready)
	var err error
	n.holder, err = start(n.Name+"/holder", filepath.Join(n.Dir(), "holder.log"), nil,
		"nsenter", "--net="+filepath.Join(netns.Dir, n.Netns), "--",
		"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script.String())
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			return nil
		}
		if n.holder.exited() || time.Now().After(deadline) {
			return fmt.Errorf("holder did not come up: %w\n%s", n.holder.waitErr, n.holder.tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// in is argv run inside the node's network and mount namespaces.
func (n *Node) in(argv ...string) []string {
	return append([]string{"nsenter", "--target=" + strconv.Itoa(n.holder.pid()), "--mount", "--net", "--"}, argv...)
}

// Exec runs argv on the node (its namespaces) and returns the output.
func (n *Node) Exec(ctx context.Context, argv ...string) (string, error) {
	return run(n.in(argv...)...)
}

func (n *Node) cgroups() error {
	for _, h := range cgroupHierarchies {
		d := filepath.Join("/sys/fs/cgroup", h, n.cgroup())
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if h == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cni gives the node Debian's reference plugins and a bridge network, so
// the runtime reports the network ready; Cutover's pods use the host
// network, and a CNI daemon (flannel) may install its own configuration
// over this one.
func (n *Node) cni() error {
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		b, err := os.ReadFile(filepath.Join(CNIPluginDir, p))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(n.HostPath("/opt/cni/bin"), p), b, 0o755); err != nil {
			return err
		}
	}
	subnet := fmt.Sprintf("198.19.%d.0/24", 200+n.Index)
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "cutover-cluster",
  "plugins": [
    {"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, subnet)
	return os.WriteFile(filepath.Join(n.HostPath("/etc/cni/net.d"), "90-cutover-cluster.conflist"), []byte(conf), 0o644)
}

func (n *Node) startContainerd(ctx context.Context) error {
	rd := n.runDir()
	root := filepath.Join(n.Dir(), "containerd")
	conf := fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %q

  [plugins.'io.containerd.cri.v1.runtime']
    # Pod network namespaces under this node's state, not the machine's
    # /run/netns, which every node shares.
    netns_mounts_under_state_dir = true
    # Root here lacks CAP_SYS_RESOURCE: runc cannot set a negative
    # oom_score_adj, which every sandbox would ask for.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        # One runc state directory per node: the nodes share the machine's /run.
        Root = %q
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  # One NRI socket per node: the nodes share the machine's /var/run/nri.
  [plugins.'io.containerd.nri.v1.nri']
    socket_path = %q
`, root, filepath.Join(rd, "state"), n.sock(), n.sock()+".ttrpc", n.c.cfg.PauseImage, filepath.Join(rd, "runc"), filepath.Join(rd, "nri.sock"))
	cf := filepath.Join(n.Dir(), "containerd.toml")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	var err error
	// containerd finds its shim on PATH.
	env := []string{"PATH=" + ContainerdDir() + ":" + os.Getenv("PATH")}
	n.containerd, err = start(n.Name+"/containerd", filepath.Join(n.Dir(), "containerd.log"), env,
		n.in(filepath.Join(ContainerdDir(), "containerd"), "--config", cf, "--log-level", "warn")...)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		if _, err := run(n.ctr("version")...); err == nil {
			return nil
		}
		if n.containerd.exited() {
			return fmt.Errorf("containerd exited: %w\n%s", n.containerd.waitErr, n.containerd.tail(20))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("containerd not answering after 60s\n%s", n.containerd.tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *Node) ctr(args ...string) []string {
	return append([]string{filepath.Join(ContainerdDir(), "ctr"), "--address", n.sock(), "--namespace", "k8s.io"}, args...)
}

// ImportImage imports an image tarball (an OCI layout, as make images
// writes it) into the node's containerd, as docs/install.md's air-gapped
// steps do: the import names the image by its tag only, so each image is
// also named repo@digest, the reference the release manifests pin.
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	if _, err := run(n.ctr("images", "import", tarball)...); err != nil {
		return fmt.Errorf("import %s: %w", tarball, err)
	}
	pins, err := ociPins(tarball)
	if err != nil {
		return fmt.Errorf("import %s: %w", tarball, err)
	}
	for tag, pinned := range pins {
		if _, err := run(n.ctr("images", "tag", "--force", tag, pinned)...); err != nil {
			return fmt.Errorf("import %s: %w", tarball, err)
		}
	}
	return nil
}

// ociPins reads an OCI layout tarball's index.json: for each image named
// in it (containerd's name annotation), its tag reference and the
// repo@digest one.
func ociPins(tarball string) (map[string]string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("no index.json: %w", err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Digest      string            `json:"digest"`
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return nil, fmt.Errorf("index.json: %w", err)
		}
		pins := map[string]string{}
		for _, m := range idx.Manifests {
			name := m.Annotations["io.containerd.image.name"]
			if name == "" {
				continue
			}
			repo := name
			if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
				repo = name[:i]
			}
			pins[name] = repo + "@" + m.Digest
		}
		return pins, nil
	}
}

// Ctr runs ctr against the node's containerd (namespace k8s.io) inside the
// node's namespaces, as an admin on the node would.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	return run(n.in(n.ctr(args...)...)...)
}

// RemoveImage removes ref from the node's containerd.
func (n *Node) RemoveImage(ref string) error {
	_, err := run(n.ctr("images", "rm", ref)...)
	return err
}

// Images lists the references in the node's containerd.
func (n *Node) Images() ([]string, error) {
	out, err := run(n.ctr("images", "ls", "-q")...)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

func (n *Node) startKubelet() error {
	c := n.c
	kc, err := c.pki.kubeconfig("kubelet-"+n.Name, "system:node:"+n.Name, []string{"system:nodes"}, c.apiURL())
	if err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1; 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
failSwapOn: false
resolvConf: ""
# Nothing can be pulled again: never collect an imported image.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%%", "imagefs.available": "1%%", "nodefs.inodesFree": "1%%"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
maxPods: 40
`, n.cgroup(), n.sock(), n.IP(), c.pki.caFile())
	cf := filepath.Join(n.Dir(), "kubelet.yaml")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	n.kubelet, err = start(n.Name+"/kubelet", filepath.Join(n.Dir(), "kubelet.log"), nil, n.in(kubeBin("kubelet"),
		"--config="+cf, "--kubeconfig="+kc,
		"--hostname-override="+n.Name, "--node-ip="+n.IP().String(),
		"--v=1")...)
	return err
}

func (n *Node) startKubeProxy() error {
	c := n.c
	kc, err := c.pki.kubeconfig("kube-proxy-"+n.Name, "system:kube-proxy", nil, c.apiURL())
	if err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection: {kubeconfig: %s}
# The nodes share the machine's conntrack table limits: leave them.
conntrack: {maxPerCore: 0, min: 0}
`, PodCIDR, n.Name, n.IP(), kc)
	cf := filepath.Join(n.Dir(), "kube-proxy.yaml")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	n.kubeProxy, err = start(n.Name+"/kube-proxy", filepath.Join(n.Dir(), "kube-proxy.log"), nil,
		n.in(kubeBin("kube-proxy"), "--config="+cf, "--v=1")...)
	return err
}

// stop stops the node's kubelet and kube-proxy, kills its pods' processes
// (its cgroup tree) and containerd's shims for it, then containerd and the
// namespace holder. A node's processes are found by its cgroup and by its
// containerd's socket path, never by name.
func (n *Node) stop() error {
	var errs []error
	errs = append(errs, n.kubelet.stop(stopWait), n.kubeProxy.stop(stopWait))
	errs = append(errs, killCgroup(n.cgroup()))
	for _, pid := range shimPIDs(n.sock()) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	errs = append(errs, n.containerd.stop(stopWait), n.holder.stop(stopWait))
	if n.ovs != nil {
		errs = append(errs, n.ovs.Stop())
	}
	return errors.Join(errs...)
}

// shimPIDs are the containerd-shim processes serving the containerd at
// sock: their command line names its address.
func shimPIDs(sock string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == sock && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killCgroup SIGKILLs every process in cgroup cg (all v1 hierarchies'
// views agree; the pids one is read) and removes the cgroup trees.
func killCgroup(cg string) error {
	base := filepath.Join("/sys/fs/cgroup/pids", cg)
	if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for attempt := 0; attempt < 50; attempt++ {
		n := 0
		_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					n++
				}
			}
			return nil
		})
		if n == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, h := range cgroupHierarchies {
		errs = append(errs, rmdirTree(filepath.Join("/sys/fs/cgroup", h, cg)))
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup directory tree bottom-up (cgroupfs takes
// rmdir, not unlink).
func rmdirTree(root string) error {
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; try < 20; try++ {
			if err := syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
				last = nil
				break
			} else {
				last = fmt.Errorf("rmdir %s: %w", dirs[i], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return last
}

// Teardown removes what a cluster named name left behind: its namespaces,
// its nodes' pods and shims, its cgroups and /run/name. Up calls it first.
func Teardown(name string) error {
	var errs []error
	ents, _ := os.ReadDir(filepath.Join("/run", name))
	for _, e := range ents {
		for _, pid := range shimPIDs(filepath.Join("/run", name, e.Name(), "containerd.sock")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, h := range []string{"pids"} {
		cgs, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h))
		for _, e := range cgs {
			if e.IsDir() && strings.HasPrefix(e.Name(), name+"-") {
				errs = append(errs, killCgroup("/"+e.Name()))
			}
		}
	}
	nss, err := netns.List(name + "-")
	errs = append(errs, err)
	// Whatever still runs in the cluster's namespaces is the cluster's: a
	// node's detached Open vSwitch, a shim whose containerd was killed
	// with a crashed test. Deleting a namespace's name stops none of them.
	killInNetns(nss)
	for _, ns := range nss {
		errs = append(errs, netns.Delete(ns))
	}
	errs = append(errs, os.RemoveAll(filepath.Join("/run", name)))
	return errors.Join(errs...)
}

// killInNetns SIGKILLs every process whose network namespace is one of
// the named ones (compared by inode), and waits a moment for them to go.
func killInNetns(names []string) {
	inodes := map[uint64]bool{}
	for _, ns := range names {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(netns.Dir, ns), &st) == nil {
			inodes[st.Ino] = true
		}
	}
	if len(inodes) == 0 {
		return
	}
	self := os.Getpid()
	for attempt := 0; attempt < 20; attempt++ {
		killed := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) == nil && inodes[st.Ino] {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed++
			}
		}
		if killed == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ipBatch(ns string, lines ...string) error {
	for _, l := range lines {
		if _, err := run(append([]string{"ip", "-n", ns}, strings.Fields(l)...)...); err != nil {
			return err
		}
	}
	return nil
}

func serviceRange() string {
	return kubetest.ServiceClusterIPRange
}

func pemECKey(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
