package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/fakeagent"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// lab is N agents served over bufconn (one listener and one gRPC server
// each, as on real nodes) and a coordinator whose API is served over
// bufconn too. Addresses are 198.18.0.x:9443 but nothing is ever sent to
// them: the dialer maps them to the in-memory listeners.
type lab struct {
	t        *testing.T
	dir      string
	inv      Inventory
	fakes    map[string]*fakeagent.Agent
	lis      map[string]*bufconn.Listener
	servers  map[string]*grpc.Server
	c        *Coordinator
	client   coordinatorv1.CoordinatorServiceClient
	verifier Verifier
	hooks    []Hook
	cfg      func(*Config) // adjusts testConfig (then l.restart())
	extra    []Option      // more options for every coordinator the lab starts
}

const fromPort = 4789

func newLab(t *testing.T, n int, services map[string]agentv1.AgentServiceServer) *lab {
	t.Helper()
	return newLabWith(t, n, services, nil)
}

// newLabWith is newLab where serve, when set, serves each node's agent on
// its listener itself (the real agent's Run, say).
func newLabWith(t *testing.T, n int, services map[string]agentv1.AgentServiceServer, serve func(node string, lis *bufconn.Listener)) *lab {
	t.Helper()
	return newLabHooks(t, n, services, serve)
}

// newLabHooks is newLabWith with hooks given to every coordinator the lab
// starts (restarts included).
func newLabHooks(t *testing.T, n int, services map[string]agentv1.AgentServiceServer, serve func(node string, lis *bufconn.Listener), hooks ...Hook) *lab {
	t.Helper()
	l := &lab{t: t, dir: t.TempDir(), fakes: map[string]*fakeagent.Agent{}, lis: map[string]*bufconn.Listener{}, servers: map[string]*grpc.Server{}, hooks: hooks}
	var specs []AgentSpec
	for i := 1; i <= n; i++ {
		node := fmt.Sprintf("n%d", i)
		addr := fmt.Sprintf("198.18.0.%d:9443", i)
		rack := "a"
		if i%2 == 0 {
			rack = "b"
		}
		specs = append(specs, AgentSpec{Node: node, Address: addr, Labels: map[string]string{"rack": rack}})
		if serve != nil {
			lis := bufconn.Listen(1 << 20)
			l.lis[addr] = lis
			serve(node, lis)
			continue
		}
		var svc agentv1.AgentServiceServer
		if services != nil {
			svc = services[node]
		} else {
			f := fakeagent.New(node, fromPort)
			l.fakes[node] = f
			svc = f
		}
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		fakeagent.Register(s, svc)
		go func() { _ = s.Serve(lis) }()
		l.lis[addr], l.servers[node] = lis, s
		t.Cleanup(s.Stop)
	}
	inv, err := NewInventory("test", specs)
	if err != nil {
		t.Fatal(err)
	}
	l.inv = inv
	l.start()
	return l
}

func (l *lab) testConfig() Config {
	cfg := Default()
	cfg.StateDir = l.dir
	cfg.Insecure = true
	cfg.StepTimeout = 2 * time.Second
	cfg.Deadman = 5 * time.Second
	cfg.RollbackAttempts = 2
	// The fake agents' wake-ups spread with the load of a shared machine
	// (goroutines, -race), which is not what the tests assert on; the
	// tests of the spread warning set the target.
	cfg.SpreadTarget = 0
	if l.cfg != nil {
		l.cfg(&cfg)
	}
	return cfg
}

// dial reaches the agent listening at addr in the lab.
func (l *lab) dial(ctx context.Context, addr string) (net.Conn, error) {
	if lis, ok := l.lis[addr]; ok {
		return lis.DialContext(ctx)
	}
	return nil, fmt.Errorf("no test listener at %s", addr)
}

// start builds a coordinator over the lab's state dir and resumes the
// journal (a restart, when one ran before).
func (l *lab) start() {
	t := l.t
	t.Helper()
	dial := grpc.WithContextDialer(l.dial)
	var opts []Option
	opts = append(opts, WithDialOptions(dial, grpc.WithTransportCredentials(insecure.NewCredentials())),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if l.verifier != nil {
		opts = append(opts, WithVerifier(l.verifier))
	}
	for _, h := range l.hooks {
		opts = append(opts, WithHook(h))
	}
	opts = append(opts, l.extra...)
	c, err := New(l.testConfig(), l.inv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	api := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	Serve(s, c)
	go func() { _ = s.Serve(api) }()
	cc, err := grpc.NewClient("passthrough:///coordinator", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return api.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	l.c, l.client = c, coordinatorv1.NewCoordinatorServiceClient(cc)
	t.Cleanup(func() { cc.Close(); s.Stop(); c.Close() })
}

// crash stops the coordinator abruptly (operations stop where they are).
func (l *lab) crash() {
	l.c.cancel()
	l.c.Close()
}

// cutover runs a cutover to the end and returns the last report (or the
// RPC error) and every event message.
func (l *lab) cutover(req *coordinatorv1.CutoverRequest) (*coordinatorv1.Report, []string, error) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := l.client.Cutover(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	return drain(st)
}

func drain(st grpc.ServerStreamingClient[coordinatorv1.OperationEvent]) (*coordinatorv1.Report, []string, error) {
	var msgs []string
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil, msgs, fmt.Errorf("stream ended without a report")
		}
		if err != nil {
			return nil, msgs, err
		}
		m := ev.Phase + ": " + ev.Message
		if ev.Node != "" {
			m = ev.Phase + " " + ev.Node + ": " + ev.Message
		}
		msgs = append(msgs, m)
		if ev.Report != nil {
			return ev.Report, msgs, nil
		}
	}
}

// dump is every fake agent's state, one line each, in node order.
func (l *lab) dump() string {
	var lines []string
	for _, a := range l.inv.Agents {
		lines = append(lines, l.fakes[a.Node].Dump())
	}
	return strings.Join(lines, "\n")
}

// nobodyGot fails if any agent received method.
func (l *lab) nobodyGot(method string) {
	l.t.Helper()
	for n, f := range l.fakes {
		if f.Called(method) {
			l.t.Errorf("agent %s received %s: %v", n, method, f.CallLog())
		}
	}
}

func (l *lab) everyoneGot(method string) {
	l.t.Helper()
	for n, f := range l.fakes {
		if !f.Called(method) {
			l.t.Errorf("agent %s never received %s: %v", n, method, f.CallLog())
		}
	}
}

func wantDump(t *testing.T, got, want string) {
	t.Helper()
	want = strings.TrimSpace(strings.ReplaceAll(want, "\t", ""))
	if got != want {
		t.Errorf("agents:\n%s\nwant:\n%s", got, want)
	}
}
