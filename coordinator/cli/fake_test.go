package cli

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// fakeCoord is a scripted CoordinatorService that records what it was
// asked. Tests run the real coordctl against it over a real 127.0.0.1
// socket.
type fakeCoord struct {
	coordinatorv1.UnimplementedCoordinatorServiceServer

	mu       sync.Mutex
	calls    []string // RPC names, in order
	requests []proto.Message

	agents []*coordinatorv1.Agent
	plan   *coordinatorv1.PlanResponse
	path   *coordinatorv1.PathCheckResult  // PathCheck
	events []*coordinatorv1.OperationEvent // streamed by Cutover and Rollback
	report *coordinatorv1.Report           // Status
	err    error                           // returned by every RPC when set
}

func (f *fakeCoord) record(name string, req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	f.requests = append(f.requests, proto.Clone(req))
	return f.err
}

func (f *fakeCoord) Calls() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, ",")
}

func (f *fakeCoord) lastRequest() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return nil
	}
	return f.requests[len(f.requests)-1]
}

func (f *fakeCoord) ListAgents(_ context.Context, r *coordinatorv1.ListAgentsRequest) (*coordinatorv1.ListAgentsResponse, error) {
	if err := f.record("ListAgents", r); err != nil {
		return nil, err
	}
	return &coordinatorv1.ListAgentsResponse{Agents: f.agents}, nil
}

func (f *fakeCoord) PathCheck(_ context.Context, r *coordinatorv1.CutoverRequest) (*coordinatorv1.PathCheckResult, error) {
	if err := f.record("PathCheck", r); err != nil {
		return nil, err
	}
	return f.path, nil
}

func (f *fakeCoord) Plan(_ context.Context, r *coordinatorv1.CutoverRequest) (*coordinatorv1.PlanResponse, error) {
	if err := f.record("Plan", r); err != nil {
		return nil, err
	}
	return f.plan, nil
}

func (f *fakeCoord) Cutover(r *coordinatorv1.CutoverRequest, s grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	if err := f.record("Cutover", r); err != nil {
		return err
	}
	for _, e := range f.events {
		if err := s.Send(e); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeCoord) Status(_ context.Context, r *coordinatorv1.StatusRequest) (*coordinatorv1.Report, error) {
	if err := f.record("Status", r); err != nil {
		return nil, err
	}
	return f.report, nil
}

func (f *fakeCoord) Rollback(r *coordinatorv1.RollbackRequest, s grpc.ServerStreamingServer[coordinatorv1.OperationEvent]) error {
	if err := f.record("Rollback", r); err != nil {
		return err
	}
	for _, e := range f.events {
		if err := s.Send(e); err != nil {
			return err
		}
	}
	return nil
}

// countingListener counts accepted connections: "no RPC was made" is
// asserted as "no TCP connection was even opened".
type countingListener struct {
	net.Listener
	accepts atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepts.Add(1)
	}
	return c, err
}

// serve starts f on 127.0.0.1 (plaintext when creds is nil) and returns
// its address and listener.
func serve(t *testing.T, f *fakeCoord, creds credentials.TransportCredentials) (string, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	coordinatorv1.RegisterCoordinatorServiceServer(srv, f)
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), cl
}

// run executes coordctl with args and returns its exit code and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}
