// Package lab brings up and tears down a local Cutover lab: an N-node
// "cluster" of network namespaces on one Linux machine, with a VXLAN pod
// overlay shaped like a real one, and optionally the real agent and
// coordinator binaries running in it.
//
// # Topology
//
// Every address is in 198.18.0.0/15 (RFC 2544 benchmarking range) and lives
// only inside namespaces this package creates:
//
//	hub netns  cot-lab-<name>-hub   bridges ul (198.18.0.1/17, underlay)
//	                                and mg (198.18.128.1/17, management)
//	node i     cot-lab-<name>-n<i>  eth0   ↔ hub ul  (underlay)
//	                                mgmt0  ↔ hub mg  198.18.128.(10+i)/17
//
// The management network is plain kernel networking, never the overlay and
// never OVS: the control path must not depend on the network being changed
// (R6, docs/design.md). Agents listen on the node's mgmt0 address; the
// coordinator runs in the hub namespace.
//
// Backend "ovs" (OpenShift SDN's shape): each node runs its own ovsdb-server
// and userspace ovs-vswitchd (harness/ovsproc). br-ul (netdev) holds eth0 and
// the underlay address 198.18.0.(10+i)/17 on its internal port, because a
// userspace tunnel is routed through the OVS bridge that holds the underlay
// address (OVS "userspace-tunneling" doc). br0 (netdev, fail_mode=secure,
// OpenFlow13) holds vxlan0 (type vxlan, remote_ip=flow, key=flow,
// dst_port=4789, ofport 1) and its LOCAL port carries the overlay address
// 198.19.i.1/16; node i owns 198.19.i.0/24. Flows: in_port=1 → LOCAL, and per
// peer j ip/arp to 198.19.j.0/24 → set tun_dst 198.18.0.(10+j), output:1.
//
// Backend "kernel-vxlan" (flannel's shape): no OVS; eth0 carries the underlay
// address, flannel.1 is a kernel VXLAN device (VNI 1, dstport 8472,
// nolearning) with 198.19.i.0/32, and per peer an FDB entry, a permanent
// neighbor entry and an onlink route. A port-less bridge cni0 (flannel's
// name) carries 198.19.i.1/24 so both backends answer on the same overlay
// address.
//
// # Processes
//
// With Config.StartProcesses, Up issues a lab PKI (pkg/pki) into <dir>/pki,
// starts one real agent per node inside the node's namespace (listening on
// mgmt0, logging to <dir>/n<i>/agent.log) and the real coordinator in the
// hub namespace on 198.18.128.1:9444 with an inventory file, mTLS on, and
// waits until all serve /healthz. The coordinator listens on TCP only, which
// the host namespace cannot reach: coordctl runs in the hub namespace
// (CoordctlCommand builds that command line with the admin identity).
//
// # State and tear-down
//
// Everything the lab creates is recorded in <dir>/lab.json before (for
// namespaces) or as soon as (for processes) it exists, so Down works from a
// fresh process after the one that ran Up died, even by SIGKILL. Processes
// are stopped by PID, checked against the start time recorded with it so a
// reused PID is never signalled; whatever still runs inside the lab's own
// namespaces is then stopped by PID too. Namespaces are matched exactly
// (cot-lab-<name>-hub, cot-lab-<name>-n<digits>), which is why lab names may
// not contain '-'.
//
// The default lab dir is /run/cutover-lab/<name> (tmpfs, root only, gone
// after a reboot together with the namespaces it describes).
//
// This package owns the lab's namespaces, links, OVS instances and processes.
// It must not touch anything outside them: no host links, no host routes, no
// system Open vSwitch, no address outside 198.18.0.0/15.
package lab
