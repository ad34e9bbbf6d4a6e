package netns_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/vishvananda/netlink"
)

func TestCreateDoDelete(t *testing.T) {
	testenv.RequirePrivileged(t, "ip")
	name := fmt.Sprintf("cotest-ns-%d", os.Getpid())
	if err := netns.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(name) })
	if err := netns.Create(name); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second Create: got %v, want already exists", err)
	}
	var links []netlink.Link
	err := netns.Do(name, func() error {
		var err error
		links, err = netlink.LinkList()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A fresh namespace holds only loopback; the host has more.
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in fresh netns = %v, want only lo", links)
	}
	got, err := netns.List("cotest-ns-")
	if err != nil || !contains(got, name) {
		t.Fatalf("List = %v, %v; want it to hold %s", got, err, name)
	}
	if err := netns.Delete(name); err != nil {
		t.Fatal(err)
	}
	if netns.Exists(name) {
		t.Fatal("namespace still exists after Delete")
	}
	if err := netns.Delete(name); err != nil {
		t.Fatalf("Delete of a missing namespace: %v", err)
	}
}

func TestBadName(t *testing.T) {
	for _, n := range []string{"", "a/b", "a b", ".."} {
		if err := netns.Create(n); err == nil {
			t.Errorf("Create(%q) succeeded, want error", n)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
