package coordinator

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/dataplane/ovsvxlan"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ovsAgents starts real agents whose backend is the real ovs one over the
// OVS and iptables fakes, vxlan0 on br0 at fromPort; it returns the OVS
// fakes by node.
func ovsAgents(t *testing.T, n int) (*lab, map[string]*ovs.Fake) {
	t.Helper()
	switches := map[string]*ovs.Fake{}
	allow := iptables.Rule{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}
	l := realAgentsWith(t, n, func(node string) dataplane.Backend {
		o := ovs.NewFake(ovs.Interface{Name: "vxlan0", Type: "vxlan", OFPort: 1,
			Options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": "4789"}})
		switches[node] = o
		ipt := iptables.NewFake(iptables.BackendNFT)
		r := allow
		r.DPort = fromPort
		if err := ipt.EnsureChain(r.Table, r.Chain); err != nil {
			t.Fatal(err)
		}
		if err := ipt.EnsureRule(r); err != nil {
			t.Fatal(err)
		}
		be, err := ovsvxlan.New(ovsvxlan.Config{OVS: o, Interface: "vxlan0", Bridge: "br0", Ports: &udpport.Fake{},
			Firewall: &dataplane.Firewall{IPT: ipt, Templates: []iptables.Rule{allow}}})
		if err != nil {
			t.Fatal(err)
		}
		return be
	})
	return l, switches
}

// With vxlan0 deleted by hand on n3, the plan says exactly that, once: not
// "target port 4999 is not free: held by another socket" (nobody holds it)
// nor drift "0 on n3" (0 is the port nobody could read).
func TestPlanNamesMissingInterface(t *testing.T) {
	l, switches := ovsAgents(t, 3)
	switches["n3"].Delete("vxlan0")
	const want = "n3: vxlan0 not found in OVS bridge br0: "
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4999})
	if err != nil {
		t.Fatal(err)
	}
	var onN3 []string
	for _, pr := range p.Problems {
		if strings.HasPrefix(pr, "n3: ") {
			onN3 = append(onN3, pr)
		}
		for _, bad := range []string{"drift", "0 on n3", "not free", "another socket"} {
			if strings.Contains(pr, bad) {
				t.Errorf("plan problem %q says %q", pr, bad)
			}
		}
	}
	if len(onN3) != 1 || !strings.HasPrefix(onN3[0], want) {
		t.Errorf("n3's problems = %q, want one, starting %q", onN3, want)
	}
	if len(p.Problems) != len(onN3) {
		t.Errorf("plan problems = %q, want only n3's", p.Problems)
	}
	if p.CurrentPort != fromPort {
		t.Errorf("plan current port = %d, want %d (n1 and n2's)", p.CurrentPort, fromPort)
	}
	for _, np := range p.Nodes {
		if np.Node == "n3" && (np.CurrentPort != 0 || !np.TargetPortFree) {
			t.Errorf("n3's plan = %v, want current port 0 (unknown) and the target free", np)
		}
	}
	_, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("cutover = %v, want FailedPrecondition naming %q", err, want)
	}
	for node, o := range switches {
		if o.Writes() != 0 {
			t.Errorf("%s: %d OVS writes after a refused cutover", node, o.Writes())
		}
	}
}

// An agent that answers port 0 and says nothing of why is not counted as
// drift, and still stops the cutover.
func TestPlanRefusesUnreadPortWithoutReason(t *testing.T) {
	l := newLab(t, 3, nil)
	l.fakes["n2"].SetPort(0)
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(p.Problems, "\n")
	if len(p.Problems) != 1 || !strings.HasPrefix(p.Problems[0], "n2: current port not read back") || strings.Contains(got, "drift") {
		t.Fatalf("plan problems:\n%s\nwant only n2's unread port", got)
	}
}

// infoCounter is a simulated agent that counts Info calls and, when
// older, answers Preflight without the Info that rides along in its answer
// (as an agent from before that field would).
type infoCounter struct {
	*fakeagent.Agent
	older bool
	infos atomic.Int32
}

func (a *infoCounter) Info(ctx context.Context, r *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	a.infos.Add(1)
	return a.Agent.Info(ctx, r)
}

func (a *infoCounter) Preflight(ctx context.Context, r *agentv1.PreflightRequest) (*agentv1.PreflightResponse, error) {
	resp, err := a.Agent.Preflight(ctx, r)
	if a.older && resp != nil {
		resp.Info = nil
	}
	return resp, err
}

// TestPreflightOneCallPerNode: a preflight asks each agent once
// (Preflight, with its Info inside), and asks Info of an agent whose
// answer lacks it; both are judged alike.
func TestPreflightOneCallPerNode(t *testing.T) {
	agents := map[string]*infoCounter{}
	services := map[string]agentv1.AgentServiceServer{}
	for _, n := range []string{"n1", "n2", "n3"} {
		agents[n] = &infoCounter{Agent: fakeagent.New(n, fromPort), older: n == "n3"}
		services[n] = agents[n]
	}
	agents["n2"].SetReady(false, "ovsdb-server not answering")
	l := newLab(t, 3, services)
	p, err := l.client.Plan(context.Background(), &coordinatorv1.CutoverRequest{Port: 4889})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		want := int32(0)
		if n == "n3" {
			want = 1
		}
		if got := agents[n].infos.Load(); got != want {
			t.Errorf("%s: %d Info calls in the preflight, want %d", n, got, want)
		}
	}
	if p.CurrentPort != fromPort || len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "n2: agent not ready: ovsdb-server not answering") {
		t.Errorf("plan: port %d, problems %q: want %d and n2 not ready (read from the Info inside its preflight)", p.CurrentPort, p.Problems, fromPort)
	}
}
