// Package sdnsim is a stand-in for openshift-sdn's node process (the "sdn"
// container of the openshift-sdn/sdn DaemonSet), for labs and tests: it
// behaves towards the VXLAN port the way the real SDN does, so that a
// cutover that ignores it fails the way it would on a real cluster.
//
// What it reproduces (openshift/sdn pkg/network/node: node.go, healthcheck.go,
// ovscontroller.go, iptables.go):
//
//   - at start it reads the VXLAN port from the ClusterNetwork object
//     "default" (network.openshift.io/v1, field vxlanPort, default 4789) on
//     a real kube-apiserver;
//   - AlreadySetUp: br0's table 253 holds exactly one flow, the version
//     note, and OVS Interface vxlan0 options:dst_port equals that port;
//   - at start, when AlreadySetUp fails, it deletes br0 and builds it again
//     on the configured port and re-attaches the "pods" (in a lab: the
//     node's br0 flows and the overlay address of br0's LOCAL port), adds
//     the drop flow for pod traffic to the VXLAN port (table 20, priority
//     300) and writes the version note last;
//   - a health check every interval (30 s in openshift-sdn) and whenever
//     its OVSDB connection is lost and comes back: when AlreadySetUp fails
//     it exits with ExitHealthCheck, and its supervisor (the kubelet)
//     starts it again, which then rebuilds;
//   - it owns filter OPENSHIFT-FIREWALL-ALLOW and raw OPENSHIFT-NOTRACK
//     and re-syncs them every interval with the SDN's semantics: its rules
//     are appended when missing, and a chain found without one of them is
//     flushed and refilled (so other rules in it are lost).
//
// A Supervisor plays kubelet and DaemonSet controller for the stand-ins of
// a lab: one Pod object per node on the apiserver, a process per Pod,
// restart on exit, stop and start again when the Pod is deleted, rolling
// replacement when the DaemonSet's image changes, Pod readiness and
// DaemonSet status written back so that API clients see a rollout.
//
// It owns only what a real SDN owns on its node (br0, the two chains and
// jumps to them) and the Pod objects of its DaemonSet. It must not touch
// other bridges (br-ul), other chains, or anything outside the namespaces
// and OVS instances it is pointed at.
package sdnsim
