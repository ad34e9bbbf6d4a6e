package conntrack_test

import (
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/conntrack"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/vishvananda/netlink"
)

// TestDeleteUDPDstPortNarrow inserts entries with conntrack(8) in a fresh
// namespace, deletes port 4789 through netlink and reads the table back with
// conntrack -L: only UDP entries to 4789 (both families) may be gone.
func TestDeleteUDPDstPortNarrow(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "conntrack")
	ns := testenv.Netns(t, "cot-ct")

	insert := func(proto, src, dst string, sport, dport int) {
		t.Helper()
		argv := []string{"conntrack", "-I", "-p", proto, "-s", src, "-d", dst,
			"--sport", fmt.Sprint(sport), "--dport", fmt.Sprint(dport), "-t", "300"}
		if proto == "tcp" {
			argv = append(argv, "--state", "ESTABLISHED")
		}
		if out, err := netns.Command(ns, argv...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	insert("udp", "198.18.0.1", "198.18.0.2", 40000, 4789) // goes
	insert("udp", "198.18.0.2", "198.18.0.1", 40001, 4789) // goes
	insert("udp", "::1", "::1", 40002, 4789)               // goes (IPv6)
	insert("udp", "198.18.0.1", "198.18.0.2", 40003, 4889) // stays: other port
	insert("udp", "198.18.0.1", "198.18.0.2", 4789, 40004) // stays: 4789 is the source
	insert("tcp", "198.18.0.1", "198.18.0.2", 40005, 4789) // stays: not UDP
	insert("udp", "::1", "::1", 40006, 4889)               // stays (IPv6)

	nsh, err := netns.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	n, err := conntrack.Kernel{H: h}.DeleteUDPDstPort(4789)
	if err != nil || n != 3 {
		t.Fatalf("DeleteUDPDstPort(4789) = %d, %v; want 3, nil", n, err)
	}
	got := list(t, ns)
	want := []string{
		"tcp src=198.18.0.1 dst=198.18.0.2 sport=40005 dport=4789",
		"udp src=198.18.0.1 dst=198.18.0.2 sport=40003 dport=4889",
		"udp src=198.18.0.1 dst=198.18.0.2 sport=4789 dport=40004",
		"udp src=::1 dst=::1 sport=40006 dport=4889",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("conntrack -L after delete:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A second run finds nothing: the deletion is idempotent.
	if n, err := conntrack.DeleteUDPDstPort(h, 4789); err != nil || n != 0 {
		t.Fatalf("second DeleteUDPDstPort(4789) = %d, %v; want 0, nil", n, err)
	}
}

// list returns the namespace's entries (both families) as
// "proto src=.. dst=.. sport=.. dport=.." in original direction, sorted.
func list(t *testing.T, ns string) []string {
	t.Helper()
	var lines []string
	for _, fam := range []string{"ipv4", "ipv6"} {
		cmd := netns.Command(ns, "conntrack", "-L", "-f", fam)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, ee.Stderr)
			}
			t.Fatalf("conntrack -L -f %s: %v", fam, err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			keep := []string{f[0]}
			seen := map[string]bool{}
			for _, kv := range f[1:] {
				k, _, ok := strings.Cut(kv, "=")
				if !ok || seen[k] {
					continue // the reply direction repeats the keys
				}
				if k == "src" || k == "dst" || k == "sport" || k == "dport" {
					seen[k] = true
					keep = append(keep, kv)
				}
			}
			lines = append(lines, strings.Join(keep, " "))
		}
	}
	sort.Strings(lines)
	return lines
}
