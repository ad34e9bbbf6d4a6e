package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// ovsActions are an openshift-sdn node's actions as the OVS backend words
// them (agent/dataplane/ovsvxlan): long, and the same on every node.
func ovsActions(from, to int) []string {
	return []string{
		fmt.Sprintf("found in filter/OPENSHIFT-FIREWALL-ALLOW: -A OPENSHIFT-FIREWALL-ALLOW -p udp -m udp --dport %d -m comment --comment \"VXLAN incoming\" -j ACCEPT", from),
		fmt.Sprintf("iptables -t filter -I OPENSHIFT-FIREWALL-ALLOW -p udp -m udp --dport %d -m comment --comment \"VXLAN incoming\" -j ACCEPT", to),
		fmt.Sprintf("iptables -t raw -I OPENSHIFT-NOTRACK -p udp -m udp --dport %d -m comment --comment \"disable conntrack for VXLAN\" -j NOTRACK", to),
		fmt.Sprintf("ovs-ofctl add-flow br0 table=21,priority=300,udp,tp_dst=%d,actions=drop", to),
		fmt.Sprintf("ovsdb transact: wait Interface vxlan0 options:dst_port=%d, update options:dst_port=%d, next_cfg+1; wait cur_cfg; read back ofport/error", from, to),
		fmt.Sprintf("iptables -t filter -D OPENSHIFT-FIREWALL-ALLOW -p udp -m udp --dport %d -m comment --comment \"VXLAN incoming\" -j ACCEPT", from),
		fmt.Sprintf("ovs-ofctl --strict del-flows br0 table=21,priority=300,udp,tp_dst=%d", from),
	}
}

// bigPlan is a plan of n nodes on OVS, where every tenth node is a
// kernel-VXLAN one (other actions) and node 3 has its target port taken.
func bigPlan(n int) *coordinatorv1.PlanResponse {
	p := &coordinatorv1.PlanResponse{CurrentPort: 4789, TargetPort: 4889}
	// A strategy reason and a path-check summary as long as the field's:
	// each wraps to the terminal like the rest.
	p.Strategy = "atomic"
	p.StrategyReason = "auto: atomic, staged does not lose less on 3 of 200 node(s): openshift-sdn: the profile refuses the staged strategy (worker-001.cluster.example, worker-002.cluster.example, worker-003.cluster.example); the others would run staged"
	p.PathCheck = &coordinatorv1.PathCheckResult{Port: 4889, Vnis: []uint32{0, 1, 4096}, ReferenceVni: 16777214, OverlayMtu: 1450, Sizes: []uint32{100, 1400, 1500},
		Sampling: "each node sends to and receives from the same 3 peers (k=3 of 199)", Nodes: uint32(n), TookMicros: 1834}
	kernel := []string{
		"iptables -t filter -I INPUT -p udp -m udp --dport 4889 -j ACCEPT",
		"ip link add vxlan-4889 type vxlan id 1 dstport 4889 (staged, down); swap with flannel.1 at the commit instant",
		"conntrack: delete the UDP entries whose original destination port is 4789 (IPv4 and IPv6), nothing else",
		"read the device back",
		"iptables -t filter -D INPUT -p udp -m udp --dport 4789 -j ACCEPT",
	}
	for i := 1; i <= n; i++ {
		np := &coordinatorv1.NodePlan{Node: fmt.Sprintf("worker-%03d.cluster.example", i), CurrentPort: 4789, TargetPortFree: true, Actions: ovsActions(4789, 4889)}
		if i%10 == 0 {
			np.Actions = kernel
		}
		if i == 3 {
			np.TargetPortFree = false
			np.Problems = []string{"udp 4889 bound by pid 4242 (dnsmasq): stop it or choose another --port", "clock offset 2.1 s exceeds the 500 ms bound"}
		}
		p.Nodes = append(p.Nodes, np)
	}
	// A very long name is shortened in the table, never in the lists.
	p.Nodes[0].Node = "ip-198-18-0-1.a-very-long-availability-zone-name.compute.internal"
	for _, np := range p.Nodes {
		for _, pr := range np.Problems {
			p.Problems = append(p.Problems, np.Node+": "+pr)
		}
	}
	return p
}

// TestPlanReadableGolden renders plans of 4 and 200 nodes against
// testdata/plan-*.golden and asserts that the compact form fits a
// 100-column terminal, lists each distinct action list once, and that
// every node and every action is still there.
func TestPlanReadableGolden(t *testing.T) {
	for _, n := range []int{4, 200} {
		for _, wide := range []bool{false, true} {
			name := fmt.Sprintf("plan-%d", n)
			if wide {
				name += "-wide"
			}
			t.Run(name, func(t *testing.T) {
				p := bigPlan(n)
				var b bytes.Buffer
				renderPlan(&b, p, wide)
				out := b.String()
				compareGolden(t, name+".golden", out)

				if !wide {
					for i, l := range strings.Split(out, "\n") {
						if w := utf8.RuneCountInString(l); w > planWidth {
							t.Errorf("line %d is %d columns (> %d): %q", i+1, w, planWidth, l)
						}
					}
				}
				// Each distinct action appears once in the compact form.
				first := ovsActions(4789, 4889)[1]
				if got := strings.Count(strings.ReplaceAll(out, "\n         ", " "), first); !wide && got != 1 {
					t.Errorf("action %q printed %d times, want once", first, got)
				}
				for _, np := range p.Nodes {
					if !strings.Contains(out, np.Node) && !strings.Contains(out, shorten(np.Node, maxNodeCell)) {
						t.Errorf("node %s missing", np.Node)
					}
				}
				if !strings.Contains(out, "2 problem(s):") || !strings.Contains(out, "udp 4889 bound by pid 4242") {
					t.Errorf("problems not listed:\n%s", out)
				}
			})
		}
	}
}

// TestPlanWideOnlyWhereAsked: -o wide is the plan's; -o html only the
// report's (a usage error elsewhere, naming the flag and value); -o json
// of a plan is the coordinator's message unchanged.
func TestPlanOutputFormats(t *testing.T) {
	addr, _ := serve(t, &fakeCoord{plan: bigPlan(4)}, nil)
	var out, errb bytes.Buffer
	code := Execute([]string{"--coordinator", addr, "--insecure", "-o", "html", "plan", "--port", "4889"}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), `-o/--output "html"`) {
		t.Fatalf("plan -o html: exit %d, stderr %q; want %d naming the flag", code, errb.String(), ExitUsage)
	}
	out.Reset()
	errb.Reset()
	code = Execute([]string{"--coordinator", addr, "--insecure", "-o", "wide", "plan", "--port", "4889"}, &out, &errb)
	if code != ExitProblems || !strings.Contains(out.String(), "actions per node:") {
		t.Fatalf("plan -o wide: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	code = Execute([]string{"--coordinator", addr, "--insecure", "-o", "json", "plan", "--port", "4889"}, &out, &errb)
	got := &coordinatorv1.PlanResponse{}
	if err := protojson.Unmarshal(out.Bytes(), got); err != nil || code != ExitProblems {
		t.Fatalf("plan -o json: exit %d, %v:\n%s", code, err, out.String())
	}
	if !proto.Equal(got, bigPlan(4)) {
		t.Errorf("plan -o json is not the coordinator's plan:\n%s", out.String())
	}
	code = Execute([]string{"--coordinator", addr, "--insecure", "-o", "yaml", "plan", "--port", "4889"}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), `"yaml"`) {
		t.Errorf("-o yaml: exit %d, stderr %q", code, errb.String())
	}
}

// compareGolden compares got with testdata/name (-update rewrites it).
func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	golden := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (rerun with -update if intended):\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}
