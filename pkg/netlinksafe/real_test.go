package netlinksafe_test

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netlinksafe"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/vishvananda/netlink"
)

// TestWrappersInNetns runs the wrappers against a real, fresh namespace
// through a handle, without moving the test's thread.
func TestWrappersInNetns(t *testing.T) {
	testenv.RequirePrivileged(t, "ip")
	name := testenv.Netns(t, "cot-nlsafe")
	ns, err := netns.Handle(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	links, err := netlinksafe.LinkList(h)
	if err != nil || len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("LinkList = %v, %v; want only lo", links, err)
	}
	lo, err := netlinksafe.LinkByName(h, "lo")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlinksafe.AddrList(h, lo, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != "127.0.0.1" {
		t.Fatalf("AddrList(lo) = %v, %v; want 127.0.0.1", addrs, err)
	}
	routes, err := netlinksafe.RouteListFiltered(h, netlink.FAMILY_V4, &netlink.Route{Table: 255}, netlink.RT_FILTER_TABLE)
	if err != nil || len(routes) == 0 {
		t.Fatalf("local routes = %v, %v; want the loopback ones", routes, err)
	}
	if _, err := netlinksafe.NeighList(h, lo.Attrs().Index, netlink.FAMILY_V4); err != nil {
		t.Fatal(err)
	}
	if _, err := netlinksafe.LinkByName(h, "nope0"); err == nil {
		t.Fatal("LinkByName(nope0) succeeded in a fresh namespace")
	}
}
