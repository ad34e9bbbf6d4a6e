// Package cluster runs a real multi-node Kubernetes on one machine for the
// real-cluster test tier (make cluster-e2e): etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler in a hub network namespace, and
// per node a network namespace and a mount namespace of its own holding a
// containerd (2.x, built from its Go module) with runc, a kubelet and a
// kube-proxy in iptables mode, all Kubernetes binaries from the one
// k8s.io/kubernetes pinned in tools/kube (hack/kube-tools.sh builds them once
// per machine, hack/containerd.sh containerd).
//
// Every address is in 198.18.0.0/15: nodes on the hub bridge, Services in
// kubetest.ServiceClusterIPRange, pods in PodCIDR. No namespace it creates
// has a route out of the machine: each node has a blackhole default route,
// so a packet to an address the cluster does not use is dropped at its
// source, never sent to the host's uplink.
//
// A node's mount namespace gives it the host paths a real node owns
// (/var/lib/kubelet, /etc/cni/net.d, /opt/cni/bin, /run/containerd,
// /var/run/openvswitch, /var/lib/cutover, /run/flannel, the pod logs), each
// bound to a directory of its own, so hostPath volumes of DaemonSet pods
// (the Cutover agent's state, OVS's socket) are per node as on real nodes.
//
// flannel.go runs the real flannel on it (flanneld from hack/flannel-tools.sh
// as its DaemonSet, pods wired by the flannelcni stand-in for flannel's CNI
// plugin) and can add a node (AddNode) or reboot one (Node.Reboot).
//
// It owns only what it starts: the namespaces named Config.Name-*, the
// processes it started (stopped by PID), the cgroups /Config.Name-* and the
// files under Config.Dir. It must not be imported by shipped code
// (conventions_test.go).
package cluster
