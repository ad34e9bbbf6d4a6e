package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestProbePeersOf(t *testing.T) {
	var nodes []Node
	for i := 1; i <= 8; i++ {
		nodes = append(nodes, newNode("x", "/d", i, BackendOVS))
	}
	got := func(k int) string {
		var b strings.Builder
		probedBy := map[string]int{}
		for _, n := range nodes {
			var ps []string
			for _, p := range ProbePeersOf(n, nodes, k) {
				ps = append(ps, p.Name)
				probedBy[p.Name]++
			}
			fmt.Fprintf(&b, "%s:%s ", n.Name, strings.Join(ps, ","))
		}
		for _, n := range nodes {
			if probedBy[n.Name] != len(ProbePeersOf(n, nodes, k)) {
				t.Errorf("k=%d: %s probed by %d nodes, want as many as it probes", k, n.Name, probedBy[n.Name])
			}
			for _, p := range ProbePeersOf(n, nodes, k) {
				back := false
				for _, q := range ProbePeersOf(p, nodes, k) {
					back = back || q.Name == n.Name
				}
				if !back {
					t.Errorf("k=%d: %s probes %s, which does not probe it back: their answers cannot ride", k, n.Name, p.Name)
				}
			}
		}
		return strings.TrimSpace(b.String())
	}
	// Two peers: the middle distance both ways, not the neighbours
	// (pkg/ringsample says why).
	if g := got(2); !strings.HasPrefix(g, "n1:n3,n7 n2:n4,n8 ") || !strings.HasSuffix(g, "n8:n2,n6") {
		t.Errorf("k=2: %s", g)
	}
	if g, all := got(0), got(7); g != all || !strings.HasPrefix(g, "n1:n2,n3,n4,n5,n6,n7,n8 ") {
		t.Errorf("k=0 (all) %s, k=7 %s", g, all)
	}
}

func TestProbeConfig(t *testing.T) {
	c := Config{Nodes: 4}.Default()
	if c.ProbeInterval != 10*time.Millisecond || c.ProbeTimeout != 200*time.Millisecond {
		t.Fatalf("defaults %s %s", c.ProbeInterval, c.ProbeTimeout)
	}
	if c := (Config{ProbeInterval: 20 * time.Millisecond}).Default(); c.ProbeTimeout != 400*time.Millisecond {
		t.Errorf("timeout for 20ms: %s, want 20 intervals", c.ProbeTimeout)
	}
	for _, tc := range []struct {
		c     Config
		field string
	}{
		{Config{Nodes: 4, ProbeInterval: time.Microsecond}, "ProbeInterval"},
		{Config{Nodes: 4, ProbeInterval: time.Second, ProbeTimeout: time.Millisecond}, "ProbeTimeout"},
		{Config{Nodes: 4, ProbePeers: 4}, "ProbePeers"},
		{Config{Nodes: 4, ProbePeers: -1}, "ProbePeers"},
	} {
		err := tc.c.Default().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want an error naming %s", tc.c, err, tc.field)
		}
	}
	if err := (Config{Nodes: 4, ProbePeers: 4, NoProbes: true}).Default().Validate(); err != nil {
		t.Errorf("NoProbes ignores probe settings: %v", err)
	}
	args := strings.Join(agentArgs(Config{Name: "x", Nodes: 2, ProbePeers: 1}.Default(), newNode("x", "/d", 1, BackendOVS), "/p"), " ")
	if !strings.Contains(args, "--probe-listen 198.19.1.1:9445 --probe-peers n2=198.19.2.1:9445 --probe-interval 10ms --probe-timeout 200ms") {
		t.Errorf("agent args: %s", args)
	}
	args = strings.Join(agentArgs(Config{Name: "x", Nodes: 3, NoProbes: true}.Default(), newNode("x", "/d", 1, BackendOVS), "/p"), " ")
	if strings.Contains(args, "probe") {
		t.Errorf("NoProbes agent args: %s", args)
	}
}

func TestPortRule(t *testing.T) {
	if got, want := PortRule(4889), "-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT"; got != want {
		t.Errorf("PortRule %q, want the field report's %q", got, want)
	}
	if r := firewallRules(8472); !strings.Contains(r, PortRule(8472)) || !strings.Contains(r, "-A INPUT -i eth0 -p udp -j DROP") {
		t.Errorf("firewall:\n%s", r)
	}
}
