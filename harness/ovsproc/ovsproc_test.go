package ovsproc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
)

func newNetns(t *testing.T) string {
	t.Helper()
	return testenv.Netns(t, "cot-ovsproc")
}

func TestStartVxlanStop(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl")
	ns := newNetns(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: t.TempDir(), Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	dbPID, vsPID := inst.DBServerPID(), inst.VswitchdPID()
	if dbPID == 0 || vsPID == 0 {
		t.Fatalf("pids: ovsdb-server %d, ovs-vswitchd %d; want both running", dbPID, vsPID)
	}

	if _, err := inst.Vsctl(ctx, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
		"--", "add-port", "br0", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "ofport_request=1"); err != nil {
		t.Fatal(err)
	}
	ofport, err := inst.Vsctl(ctx, "get", "interface", "vxlan0", "ofport")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(ofport) != "1" {
		t.Fatalf("vxlan0 ofport = %q, want 1 (vswitchd applied the port)", ofport)
	}
	// The bridge's management socket lives in Dir, and vswitchd answers.
	if out, err := inst.Ofctl(ctx, "show", "br0"); err != nil || !strings.Contains(out, "vxlan0") {
		t.Fatalf("ovs-ofctl show br0 = %q, %v; want vxlan0 listed", out, err)
	}
	if _, err := inst.Appctl(ctx, "version"); err != nil {
		t.Fatal(err)
	}
	// br0's tap device is in the test's namespace, not the host's.
	if out, err := netns.Command(ns, "ip", "link", "show", "br0").CombinedOutput(); err != nil {
		t.Fatalf("br0 not in netns %s: %v: %s", ns, err, out)
	}

	// A fault-injection restart keeps the configuration.
	if err := inst.RestartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	if inst.VswitchdPID() == vsPID || ovsproc.PIDAlive(vsPID) {
		t.Fatalf("old vswitchd %d still alive after restart", vsPID)
	}
	newVS := inst.VswitchdPID()
	if _, err := inst.Vsctl(ctx, "get", "interface", "vxlan0", "ofport"); err != nil {
		t.Fatal(err)
	}

	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{dbPID, newVS} {
		if ovsproc.PIDAlive(pid) {
			t.Errorf("pid %d still alive after Stop", pid)
		}
	}
	if err := inst.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if inst.VswitchdPID() != 0 || inst.DBServerPID() != 0 {
		t.Fatal("PIDs still reported after Stop")
	}
}

func TestStartBadOptions(t *testing.T) {
	if _, err := ovsproc.Start(context.Background(), ovsproc.Options{}); err == nil || !strings.Contains(err.Error(), "Dir") {
		t.Fatalf("Start without Dir: %v, want error naming Dir", err)
	}
	long := "/tmp/" + strings.Repeat("x", 120)
	if _, err := ovsproc.Start(context.Background(), ovsproc.Options{Dir: long}); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("Start with long Dir: %v, want too long", err)
	}
}
