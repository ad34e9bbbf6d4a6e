package faults_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/lab"
)

// The suite's own checks, shown failing on the states they exist to
// catch (STYLE.md "a safety test must bite"). No root needed.

func labIPT(extra ...string) string {
	lines := []string{
		"*filter",
		":INPUT ACCEPT []",
		":" + lab.FirewallChain + " - []",
		"-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A INPUT -j " + lab.FirewallChain,
		"-A INPUT -i eth0 -p udp -j DROP",
	}
	return strings.Join(append(lines, append(extra, "COMMIT")...), "\n")
}

func snapOf(ipt, flows string) snapshot {
	s := snapshot{IPT: map[string]string{}, Flows: map[string]string{}}
	for _, n := range nodes {
		s.IPT[n], s.Flows[n] = ipt, flows
	}
	return s
}

const (
	baseFlows = " table=0, priority=100,ip actions=goto_table:10\n table=10, priority=0 actions=drop"
	// A profile's flow on the VXLAN port (openshift-sdn drops pod traffic
	// to it).
	sdnFlow = " table=0, priority=300,udp,tp_dst=4789 actions=drop"
)

func TestCleanCheckBites(t *testing.T) {
	base := snapOf(labIPT(lab.PortRule(fromPort)), baseFlows+"\n"+sdnFlow)
	movedFlows := baseFlows + "\n table=0, priority=300,udp,tp_dst=4889 actions=drop"
	cases := []struct {
		name string
		now  snapshot
		port int
		bad  bool
	}{
		{"success, finalized", snapOf(labIPT(lab.PortRule(toPort)), movedFlows), toPort, false},
		{"success, Finalize missing (old rule left)", snapOf(labIPT(lab.PortRule(fromPort), lab.PortRule(toPort)), movedFlows), toPort, true},
		{"success, new port never opened", snapOf(labIPT(), movedFlows), toPort, true},
		{"success, profile flow not moved", snapOf(labIPT(lab.PortRule(toPort)), base.Flows["n1"]), toPort, true},
		{"success, profile flow duplicated", snapOf(labIPT(lab.PortRule(toPort)), movedFlows+"\n"+sdnFlow), toPort, true},
		{"abort, clean", base, fromPort, false},
		{"abort, new-port rule left", snapOf(labIPT(lab.PortRule(fromPort), lab.PortRule(toPort)), base.Flows["n1"]), fromPort, true},
		{"rollback, old rule gone", snapOf(labIPT(lab.PortRule(toPort)), base.Flows["n1"]), fromPort, true},
	}
	for _, tc := range cases {
		got := cleanProblems(base, tc.now, fromPort, tc.port)
		if (len(got) > 0) != tc.bad {
			t.Errorf("%s: problems %q, want bad=%v", tc.name, got, tc.bad)
		}
	}
}

func TestConsistencyCheckBites(t *testing.T) {
	all := map[string]int{"n1": 4789, "n2": 4789, "n3": 4789}
	if p, err := agreedPort(nodes, all, nil, fromPort); err != nil || p != fromPort {
		t.Fatalf("agreeing nodes: %d, %v", p, err)
	}
	two := map[string]int{"n1": 4789, "n2": 4789}
	for name, tc := range map[string]struct {
		ports map[string]int
		errs  map[string]error
		want  int
	}{
		"a node unreadable":       {two, map[string]error{"n3": errors.New("ovsdb down")}, fromPort},
		"a node missing":          {two, nil, fromPort},
		"nodes disagree":          {map[string]int{"n1": 4789, "n2": 4889, "n3": 4789}, nil, 0},
		"agree on the wrong port": {all, nil, toPort},
	} {
		if p, err := agreedPort(nodes, tc.ports, tc.errs, tc.want); err == nil {
			t.Errorf("%s: agreed on %d", name, p)
		}
	}
}
