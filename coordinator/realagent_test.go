package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent"
	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/h2tap"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
)

// realAgents starts the real agent (agent.Run, fake dataplane) for each node
// of a lab over bufconn, and returns the dataplanes by node.
func realAgents(t *testing.T, n int) (*lab, map[string]*dataplane.Fake) {
	t.Helper()
	planes := map[string]*dataplane.Fake{}
	l := realAgentsWith(t, n, func(node string) dataplane.Backend {
		fake := dataplane.NewFake("ovs", "vxlan0", fromPort)
		planes[node] = fake
		return fake
	})
	return l, planes
}

// realAgentsWith starts the real agent for each node of a lab over bufconn,
// with the backend backend(node) returns.
func realAgentsWith(t *testing.T, n int, backend func(node string) dataplane.Backend) *lab {
	t.Helper()
	serve := func(node string, lis *bufconn.Listener) {
		be := backend(node)
		cfg := agent.Default()
		cfg.NodeName = node
		cfg.Insecure = true
		cfg.StateDir = t.TempDir()
		cfg.MetricsAddr = "127.0.0.1:0"
		// A real probe mesh over loopback: verify checks it.
		cfg.ProbeListen = loopbackProbeAddr(t, node)
		// The underlay path check binds the target port here.
		cfg.UnderlayAddress = strings.Replace(strings.Split(cfg.ProbeListen, ":")[0], "127.0.0.", "127.0.1.", 1)
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- agent.Run(ctx, cfg, agent.WithBackend(be), agent.WithListeners(lis, hl),
				agent.WithRegistry(prometheus.NewRegistry()), agent.WithLogger(slog.New(slog.DiscardHandler)))
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("agent %s: %v", node, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("agent %s did not stop", node)
			}
		})
		// Wait until it serves.
		cc, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		hc := healthpb.NewHealthClient(cc)
		deadline := time.Now().Add(10 * time.Second)
		for {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: agentv1.AgentService_ServiceDesc.ServiceName})
			if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %s not serving: %v %v", node, r, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return newLabWith(t, n, nil, serve)
}

func planePorts(planes map[string]*dataplane.Fake, n int) string {
	var s []string
	for i := 1; i <= n; i++ {
		s = append(s, fmt.Sprintf("n%d=%d", i, planes[fmt.Sprintf("n%d", i)].Port()))
	}
	return strings.Join(s, " ")
}

// TestRealAgents runs cutovers against the real agent package (fake
// dataplane) over gRPC: success, then a commit failure rolled back.
func TestRealAgents(t *testing.T) {
	const n = 4
	l, planes := realAgents(t, n)
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "real1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if got := planePorts(planes, n); got != "n1=4889 n2=4889 n3=4889 n4=4889" {
		t.Errorf("dataplanes: %s", got)
	}
	for _, nr := range rep.Nodes {
		if nr.AgentPhase != "PHASE_FINALIZED" || nr.Port != 4889 {
			t.Errorf("node %v", nr)
		}
	}
	checkCommitMargin(t, rep) // the real agent says when each Commit arrived
	t.Logf("real agents: commit spread %s", time.Duration(rep.CommitSpreadNanos))

	// Back to 4789 with a commit failure on n3: everyone returns to 4889.
	planes["n3"].SetFailure("Commit", errors.New("injected: ovsdb transaction failed"))
	rep, msgs, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "real2"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != rolledBack {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	if got := planePorts(planes, n); got != "n1=4889 n2=4889 n3=4889 n4=4889" {
		t.Errorf("dataplanes after rollback: %s", got)
	}

	// Prepare failure: abort, nobody commits.
	planes["n3"].SetFailure("Commit", nil)
	planes["n2"].SetFailure("Prepare", errors.New("injected: iptables failed"))
	rep, _, err = l.cutover(&coordinatorv1.CutoverRequest{Port: 4999, OperationId: "real3"})
	if err != nil || rep.State != aborted {
		t.Fatalf("%v %v", rep, err)
	}
	for _, ph := range rep.Phases {
		if ph.Phase == "commit" {
			t.Errorf("aborted operation has a commit phase: %v", rep.Phases) // I2
		}
	}
	if got := planePorts(planes, n); got != "n1=4889 n2=4889 n3=4889 n4=4889" {
		t.Errorf("dataplanes after abort: %s", got)
	}
}

// loopbackProbeAddr is a free UDP address on a loopback IP of node's own
// (127.0.0.10+i for node ni), for the real agent's probe mesh.
func loopbackProbeAddr(t *testing.T, node string) string {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(node, "n%d", &i); err != nil {
		t.Fatalf("node %q: want n<i>", node)
	}
	pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.%d:0", 10+i))
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	_ = pc.Close()
	return addr
}

// TestAgentConnsCarryNoPings: the coordinator's connections to real
// agents, as both sides set them up, carry no HTTP/2 pings through a
// whole cutover (callstream.DialOptions, ServerOptions: with gRPC's
// bandwidth-delay estimation on either side, answers or calls would each
// set off a ping, its acknowledgement and a window update).
func TestAgentConnsCarryNoPings(t *testing.T) {
	const n = 3
	l, _ := realAgents(t, n)
	l.c.Close()
	var mu sync.Mutex
	taps := map[string]*h2tap.Conn{}
	l.extra = []Option{WithDialOptions(grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := l.dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		tap := h2tap.New(c)
		mu.Lock()
		taps[addr] = tap
		mu.Unlock()
		return tap, nil
	}))}
	l.start()
	rep, msgs, err := l.cutover(&coordinatorv1.CutoverRequest{Port: 4889, OperationId: "pings"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.State != succeeded {
		t.Fatalf("state %s %s\n%s", rep.State, rep.Error, strings.Join(msgs, "\n"))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(taps) != n {
		t.Fatalf("%d agent connection(s) recorded; want %d", len(taps), n)
	}
	for addr, tap := range taps {
		sent, received, err := tap.Since(h2tap.Mark{})
		if err != nil {
			t.Fatal(err)
		}
		if sent[http2.FrameData] < 5 || sent[http2.FramePing] != 0 || received[http2.FramePing] != 0 {
			t.Errorf("agent at %s: the coordinator sent %v and received %v; want calls (data frames) and no pings", addr, sent, received)
		}
	}
}
