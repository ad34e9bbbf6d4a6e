// Package vxlan reads and recreates kernel VXLAN devices (flannel's
// flannel.1, Calico's vxlan.calico) to move them to another UDP port.
//
// It owns one device at a time in one network namespace, reached through
// netlink sockets opened in that namespace (Open/New), so neither tests nor
// the lab move threads; the agent uses the host namespace. It must not touch
// any other link, and must not decide when to move: the agent does.
//
// # Why recreate
//
// The kernel refuses to change IFLA_VXLAN_PORT of an existing device
// ("Cannot change port"), so a port change is a new device that keeps name,
// MAC, MTU, addresses, FDB, neighbours and routes (Snapshot, plain JSON, is
// the prior state the agent persists).
//
// # The window, measured (BenchmarkRecreate, kernel 6.18, 2 vCPU; 50 runs each,
// one address, two FDB entries, one neighbour, one route)
//
//   - delete-first (delete, add, address, FDB, neighbour, up, route: 9
//     calls): median 27.8 ms, p90 35.7 ms. Deleting a link waits for RCU
//     grace periods (10-50 ms) and the device is absent all that time.
//   - prebuilt, old device taken down then renamed (an intermediate
//     version): median 11.9 ms, p90 16 ms; taking a vxlan device down waits
//     for one grace period when its socket is released (3-10 ms, one
//     outlier of 0.5 s seen under load).
//   - prebuilt (the default, 4 calls in the window): the new device is built
//     under a temporary name with addresses, FDB and neighbours while the old
//     one carries traffic (0.35 ms, outside the window); then the old device
//     is renamed away while still up, the new one is renamed and raised in
//     ONE RTM_NEWLINK (do_setlink applies the name before the flags), the
//     routes move by replace and then the old one loses its addresses (in
//     that order: a device losing its last IPv4 address has every route
//     through it flushed, and flannel's onlink routes would be missing
//     until each was added back; TestRetireEveryStepForwards). Median
//     0.68 ms, p90 0.82 ms (2026-11-26; 0.56 and 3.8 ms in the run before
//     that order, the tail then rtnl contention with the previous run's
//     deletion). The old device is deleted after the window (~20-30 ms, not
//     counted: it no longer carries traffic) — or, with Kernel.KeepOld, left
//     renamed (OldName) for Cleanup: deletion holds the global RTNL lock,
//     so the agent defers it to Finalize, after every node has flipped. In
//     a lab where 32 nodes share one kernel, 32 deletions inside the commit
//     serialized on RTNL and pushed later nodes' flips out by up to a second.
//
// Prebuild does the build of the new device ahead (at the agent's Prepare),
// down and without addresses; Recreate adopts it if it still matches and
// tops its FDB and neighbours up to the snapshot it is given.
//
// Arm does Recreate's reading ahead too (while the agent waits for the
// commit instant): the device read, the prebuilt device topped up, and a
// netlink watch on the device joined before that read. RecreateArmed, at
// the instant, switches from that read unless the watch saw anything that
// may concern the device (ErrChanged: the caller reads afresh), so what
// the CNI adds in between is never lost (armed.go).
//
// Renaming a running link needs a kernel that allows it (6.18 does; older
// ones answer EBUSY): then the old device is taken down first, the ~12 ms
// variant above. Routes cannot be pre-attached: IPv4 refuses a nexthop on a
// down device, and a second up device with the same routes would steal
// traffic from the working one.
//
// # Per-FDB-entry destination port (measured, TestFDBPorts)
//
// The kernel stores a destination port per FDB remote (`bridge fdb ... port
// N`, NDA_PORT; netlink v1.3.1 neither sends nor parses it, so raw.go does).
// SetFDBPorts rewrites all remotes of a device in 0.05 ms (2 entries) without
// recreating anything: it moves a node's EGRESS to a new port per peer. It
// cannot move INGRESS: the device listens only on its own port, and that
// still needs Recreate. So it does not remove the window by itself; what it
// allows is ordering: a node can send to peers' new port before or after its
// own device moves. Note the kernel stores "no port" as the device's port at
// the time the entry was added and does not report a port equal to the
// device's, so Snapshot shows 0 for those.
//
// Not handled: multipath routes through the device, a VXLAN device enslaved
// to a bridge (its master is not restored), IPv6 link-local addresses (the
// same MAC regenerates them).
package vxlan
