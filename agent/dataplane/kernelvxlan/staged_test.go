package kernelvxlan

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// newStagedLab is newLab whose firewall also accepts what the staged
// receiver decapsulates (the lab's rule accepts flannel.1's by name: a
// host firewall written that way needs the same for the change).
func newStagedLab(t *testing.T) (a, b *node) {
	a, b = newLab(t, 8472)
	for _, n := range []*node{a, b} {
		run(t, n.NS, "iptables -I INPUT -i cotx+ -j ACCEPT")
	}
	return a, b
}

// TestStagedBackend drives the Stager methods as the agent does, on both
// nodes, reading back after each step from the kernel and iptables-save:
// listen (the new port opened first, the receiver up), switch and switch
// back (the overlay works throughout, both ways), unlisten (the node as it
// was, firewall and device), then listen, switch, retire (the device on
// the new port with its own rp_filter back, the old port closed, no
// receiver left). Replays of every step change nothing.
func TestStagedBackend(t *testing.T) {
	ctx := context.Background()
	a, b := newStagedLab(t)
	nodes := []*node{a, b}
	// a's device has loose rp_filter of its own: Retire must put it back
	// on the device that replaces it.
	if err := a.Kernel.SetReversePathFilter(labDev, 2); err != nil {
		t.Fatal(err)
	}
	dump := func(n *node) string {
		s, err := n.Kernel.Snapshot(labDev)
		if err != nil {
			t.Fatal(err)
		}
		links := run(t, n.NS, "ip -o link show type vxlan")
		return s.Text() + stripLinks(links) + vxlantest.SaveRules(run(t, n.NS, "iptables-save -t filter"))
	}
	before := map[*node]string{}
	snaps := map[*node]dataplane.Snapshot{}
	for _, n := range nodes {
		before[n] = dump(n)
		s, err := n.b.Snapshot(ctx, 8472, 4889)
		if err != nil {
			t.Fatal(err)
		}
		snaps[n] = s
		if p := n.b.StagedProblems(ctx, 4889); len(p) != 0 {
			t.Fatalf("%s: staged problems %q", n.NS, p)
		}
	}
	connected := func(when string) {
		t.Helper()
		if got := vxlantest.Connectivity(t, a.Node, b.Node, 2*time.Second); got != vxlantest.AllPaths {
			t.Fatalf("%s: overlay paths %q, want %q", when, got, vxlantest.AllPaths)
		}
	}
	for round := range 2 {
		for _, n := range nodes {
			for range 2 { // a replay changes nothing
				if err := n.b.Listen(ctx, snaps[n]); err != nil {
					t.Fatal(err)
				}
			}
			if !hasRule(t, n.NS, 4889) || !strings.Contains(run(t, n.NS, "ip -o link show "+vxlan.TmpName(labDev)), "UP") {
				t.Fatalf("%s after listen: rule for 4889 %v, links:\n%s", n.NS, hasRule(t, n.NS, 4889), run(t, n.NS, "ip -o link show type vxlan"))
			}
		}
		connected("listening")
		for _, n := range nodes {
			for range 2 {
				st, err := n.b.SwitchSend(ctx, snaps[n])
				if err != nil || st.Port != 4889 {
					t.Fatalf("%s switch: %+v %v", n.NS, st, err)
				}
			}
		}
		connected("switched")
		if round == 0 {
			for _, n := range nodes {
				if st, err := n.b.UnswitchSend(ctx, snaps[n]); err != nil || st.Port != 8472 {
					t.Fatalf("%s switch back: %+v %v", n.NS, st, err)
				}
			}
			connected("switched back")
			for _, n := range nodes {
				for range 2 {
					if err := n.b.Unlisten(ctx, snaps[n]); err != nil {
						t.Fatal(err)
					}
				}
				if got := dump(n); got != before[n] {
					t.Fatalf("%s after unlisten:\n%s\nwant as before:\n%s", n.NS, got, before[n])
				}
			}
			connected("unlistened")
			continue
		}
		for _, n := range nodes {
			for range 2 {
				st, err := n.b.Retire(ctx, snaps[n])
				if err != nil || st.Port != 4889 {
					t.Fatalf("%s retire: %+v %v", n.NS, st, err)
				}
			}
			if hasRule(t, n.NS, 8472) || !hasRule(t, n.NS, 4889) {
				t.Errorf("%s after retire: 8472 open %v, 4889 open %v", n.NS, hasRule(t, n.NS, 8472), hasRule(t, n.NS, 4889))
			}
			if links := stripLinks(run(t, n.NS, "ip -o link show type vxlan")); links != labDev {
				t.Errorf("%s after retire: VXLAN links %q, want only %s", n.NS, links, labDev)
			}
		}
		connected("retired")
	}
	if rp, _, err := a.Kernel.ReversePathFilter(labDev); err != nil || rp != 2 {
		t.Errorf("a's device rp_filter after retire: %d %v, want its own 2 back", rp, err)
	}
	if rp, _, err := b.Kernel.ReversePathFilter(labDev); err != nil || rp != 0 {
		t.Errorf("b's device rp_filter after retire: %d %v, want its own 0", rp, err)
	}
}

// TestStagedProblemsRPFilterAll: conf.all.rp_filter on refuses the staged
// strategy, naming the sysctl and the value.
func TestStagedProblemsRPFilterAll(t *testing.T) {
	a, _ := newStagedLab(t)
	run(t, a.NS, "sysctl -q -w net.ipv4.conf.all.rp_filter=2")
	p := a.b.StagedProblems(context.Background(), 4889)
	if len(p) != 1 || !strings.Contains(p[0], "net.ipv4.conf.all.rp_filter is 2") {
		t.Fatalf("staged problems %q", p)
	}
}

// stripLinks keeps the link names of `ip -o link show` output.
func stripLinks(out string) string {
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 {
			names = append(names, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	return strings.Join(names, " ")
}
