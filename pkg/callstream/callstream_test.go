package callstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	callstreamv1 "github.com/cutover-dev/cutover/proto/callstream/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// agent is a small AgentService: Prepare echoes its operation id (or
// fails as the id asks), Commit blocks until its context ends and records
// why, Info names the node.
type agent struct {
	agentv1.UnimplementedAgentServiceServer
	node     string
	calls    *callstream.Server // nil: no Calls method (an older agent)
	deadline chan time.Duration // Commit: the deadline its context had left
	ended    chan error         // Commit: why its context ended
	release  chan struct{}      // closed: Commit answers instead of waiting
}

func (a *agent) Info(context.Context, *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	return &agentv1.InfoResponse{Node: a.node, CurrentPort: 4789}, nil
}

func (a *agent) Prepare(ctx context.Context, r *agentv1.PrepareRequest) (*agentv1.PrepareResponse, error) {
	if r.OperationId == "late" {
		return nil, agentv1.LateStatus("operation late: commit late by 912ms: not applied", 912*time.Millisecond)
	}
	if code, ok := strings.CutPrefix(r.OperationId, "fail-"); ok {
		var c codes.Code
		if err := c.UnmarshalJSON([]byte(`"` + code + `"`)); err != nil {
			return nil, err
		}
		return nil, status.Errorf(c, "operation %s refused", r.OperationId)
	}
	return &agentv1.PrepareResponse{Status: &agentv1.OperationStatus{OperationId: r.OperationId, Phase: agentv1.Phase_PHASE_PREPARED}}, nil
}

func (a *agent) Commit(ctx context.Context, r *agentv1.CommitRequest) (*agentv1.CommitResponse, error) {
	if dl, ok := ctx.Deadline(); ok {
		a.deadline <- time.Until(dl)
	} else {
		a.deadline <- 0
	}
	select {
	case <-ctx.Done():
		a.ended <- ctx.Err()
		return nil, ctx.Err()
	case <-a.release:
		return &agentv1.CommitResponse{ReadbackPort: 4889}, nil
	}
}

func (a *agent) Calls(st grpc.BidiStreamingServer[callstreamv1.Frame, callstreamv1.Frame]) error {
	if a.calls == nil {
		return status.Error(codes.Unimplemented, "method Calls not implemented")
	}
	return a.calls.Serve(st)
}

// counts tells the calls the server ran unary from those it ran off the
// stream, and the streams opened.
type counts struct{ unary, streamed, streams atomic.Int64 }

type server struct {
	a     *agent
	srv   *grpc.Server
	calls *callstream.Server
	n     *counts
}

// serve starts an agent on l; streams says whether it has the Calls method.
func serve(t *testing.T, l net.Listener, streams bool) *server {
	t.Helper()
	n := &counts{}
	a := &agent{node: "n1", deadline: make(chan time.Duration, 16), ended: make(chan error, 16), release: make(chan struct{})}
	s := grpc.NewServer(
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			n.unary.Add(1)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			n.streams.Add(1)
			return h(srv, ss)
		}))
	if streams {
		a.calls = callstream.NewServer(&agentv1.AgentService_ServiceDesc, a, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			n.streamed.Add(1)
			return h(ctx, req)
		})
	}
	agentv1.RegisterAgentServiceServer(s, a)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return &server{a: a, srv: s, calls: a.calls, n: n}
}

// client dials l and returns an AgentService client over a call stream.
func client(t *testing.T, dial func(context.Context, string) (net.Conn, error)) (agentv1.AgentServiceClient, *callstream.Conn) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///agent", grpc.WithContextDialer(dial), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c := callstream.NewConn(cc, agentv1.AgentService_Calls_FullMethodName, callstream.Options{})
	t.Cleanup(c.Close)
	return agentv1.NewAgentServiceClient(c), c
}

func bufServer(t *testing.T, streams bool) (*server, agentv1.AgentServiceClient, *callstream.Conn) {
	l := bufconn.Listen(1 << 20)
	s := serve(t, l, streams)
	cl, c := client(t, func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) })
	return s, cl, c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestCallsGoOverOneStream: the calls of a generated client reach the
// handlers through the stream, all of them over one, answers matched to
// their calls when many run at once.
func TestCallsGoOverOneStream(t *testing.T) {
	s, cl, _ := bufServer(t, true)
	ctx := ctxFor(t, 10*time.Second)
	info, err := cl.Info(ctx, &agentv1.InfoRequest{})
	if err != nil || info.Node != "n1" || info.CurrentPort != 4789 {
		t.Fatalf("Info = %v, %v; want node n1 on 4789", info, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Go(func() {
			id := fmt.Sprintf("op-%d", i)
			r, err := cl.Prepare(ctx, &agentv1.PrepareRequest{OperationId: id})
			if err == nil && r.GetStatus().GetOperationId() != id {
				err = fmt.Errorf("call %s got the answer of %s", id, r.GetStatus().GetOperationId())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if u, st, n := s.n.unary.Load(), s.n.streamed.Load(), s.n.streams.Load(); u != 0 || st != 101 || n != 1 {
		t.Fatalf("server ran %d call(s) unary, %d off the stream, over %d stream(s); want 0, 101, 1", u, st, n)
	}
}

// TestOlderServerCalledUnary: a server without the stream method is
// called unary, and asked for the stream once, not at every call.
func TestOlderServerCalledUnary(t *testing.T) {
	s, cl, c := bufServer(t, false)
	ctx := ctxFor(t, 10*time.Second)
	if err := c.Open(ctx); err != nil {
		t.Fatalf("Open of an older server: %v; want nil (it is called unary)", err)
	}
	for i := range 3 {
		r, err := cl.Prepare(ctx, &agentv1.PrepareRequest{OperationId: fmt.Sprint("op-", i)})
		if err != nil || r.GetStatus().GetOperationId() != fmt.Sprint("op-", i) {
			t.Fatalf("Prepare %d = %v, %v", i, r, err)
		}
	}
	if u, st, n := s.n.unary.Load(), s.n.streamed.Load(), s.n.streams.Load(); u != 3 || st != 0 || n != 1 {
		t.Fatalf("server ran %d call(s) unary, %d off the stream, was asked %d stream(s); want 3, 0, 1", u, st, n)
	}
}

// TestStatusAsUnary: a handler's status reaches the caller with its code
// and message, as a unary call's does.
func TestStatusAsUnary(t *testing.T) {
	for _, streams := range []bool{true, false} {
		_, cl, _ := bufServer(t, streams)
		_, err := cl.Prepare(ctxFor(t, 10*time.Second), &agentv1.PrepareRequest{OperationId: "fail-FAILED_PRECONDITION"})
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "operation fail-FAILED_PRECONDITION refused" {
			t.Fatalf("streams %t: err = %v; want FAILED_PRECONDITION with the handler's message", streams, err)
		}
		// Its details too: an agent's late refusal says how late in one.
		_, err = cl.Prepare(ctxFor(t, 10*time.Second), &agentv1.PrepareRequest{OperationId: "late"})
		if d, ok := agentv1.LatenessOf(err); !ok || d != 912*time.Millisecond {
			t.Fatalf("streams %t: err = %v: lateness %s %t, want the status's details (912ms) through the call", streams, err, d, ok)
		}
	}
}

// TestDeadlineAndCancelReachTheHandler: the handler's context carries the
// caller's deadline, ends when it passes (the caller then gets
// DEADLINE_EXCEEDED), and ends when the caller cancels.
func TestDeadlineAndCancelReachTheHandler(t *testing.T) {
	s, cl, _ := bufServer(t, true)
	_, err := cl.Commit(ctxFor(t, 300*time.Millisecond), &agentv1.CommitRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Commit past its deadline: %v; want DEADLINE_EXCEEDED", err)
	}
	if left := <-s.a.deadline; left <= 0 || left > 300*time.Millisecond {
		t.Fatalf("handler's deadline %v ahead; want within the caller's 300 ms", left)
	}
	select {
	case err := <-s.a.ended:
		// Its own deadline, or the caller's cancel that follows the
		// caller's deadline (they race, as with unary calls).
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v; want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler's context did not end with the caller's deadline")
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cl.Commit(ctx, &agentv1.CommitRequest{})
		done <- err
	}()
	if left := <-s.a.deadline; left != 0 {
		t.Fatalf("handler of a call without a deadline has one %v ahead", left)
	}
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled Commit: %v; want CANCELED", err)
	}
	select {
	case err := <-s.a.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v; want cancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller cancelled, and the handler's context did not end")
	}
}

// TestDrainLetsGracefulStopEnd: Drain lets the running call answer, then
// ends the stream, so that GracefulStop returns; the client's next call
// fails UNAVAILABLE instead of waiting.
func TestDrainLetsGracefulStopEnd(t *testing.T) {
	s, cl, _ := bufServer(t, true)
	ctx := ctxFor(t, 10*time.Second)
	done := make(chan error, 1)
	go func() {
		r, err := cl.Commit(ctx, &agentv1.CommitRequest{})
		if err == nil && r.ReadbackPort != 4889 {
			err = fmt.Errorf("answer %v", r)
		}
		done <- err
	}()
	<-s.a.deadline // the Commit runs
	s.calls.Drain()
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call still running")
	case <-time.After(200 * time.Millisecond):
	}
	close(s.a.release)
	if err := <-done; err != nil {
		t.Fatalf("the call running at Drain: %v; want its answer", err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop still waits 5 s after Drain and the last answer")
	}
	if _, err := cl.Info(ctx, &agentv1.InfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("call after the server stopped: %v; want UNAVAILABLE", err)
	}
}

// TestStreamReopensAfterRestart: a call running when the server goes away
// fails UNAVAILABLE; once the server is back on the same address the
// next call opens a new stream and is answered.
func TestStreamReopensAfterRestart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	s := serve(t, l, true)
	cl, _ := client(t, func(ctx context.Context, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	})
	ctx := ctxFor(t, 20*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := cl.Commit(ctx, &agentv1.CommitRequest{})
		done <- err
	}()
	<-s.a.deadline
	s.srv.Stop()
	if err := <-done; status.Code(err) != codes.Unavailable {
		t.Fatalf("call running when the server stopped: %v; want UNAVAILABLE", err)
	}
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s2 := serve(t, l2, true)
	// gRPC reconnects with back-off: the first calls may find it down.
	for {
		info, err := cl.Info(ctx, &agentv1.InfoRequest{})
		if err == nil {
			if info.Node != "n1" {
				t.Fatalf("Info = %v", info)
			}
			break
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatalf("Info after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, n := s2.n.streamed.Load(), s2.n.streams.Load(); st != 1 || n != 1 {
		t.Fatalf("restarted server ran %d call(s) off %d stream(s); want 1 over 1", st, n)
	}
}

// TestIdleStreamCloses: with Options.Idle the stream closes once no call
// has run for that long, so that the connection can go idle
// (grpc.WithIdleTimeout), and the next call opens another.
func TestIdleStreamCloses(t *testing.T) {
	l := bufconn.Listen(1 << 20)
	s := serve(t, l, true)
	cc, err := grpc.NewClient("passthrough:///agent", grpc.WithIdleTimeout(100*time.Millisecond),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c := callstream.NewConn(cc, agentv1.AgentService_Calls_FullMethodName, callstream.Options{Idle: 50 * time.Millisecond})
	t.Cleanup(c.Close)
	cl := agentv1.NewAgentServiceClient(c)
	ctx := ctxFor(t, 10*time.Second)
	if _, err := cl.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got := cc.GetState(); got != connectivity.Idle {
		t.Fatalf("connection %s a second after the last call; want IDLE (the stream closed after 50 ms, the connection 100 ms later)", got)
	}
	if _, err := cl.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Fatalf("call after the idle close: %v", err)
	}
	if st, n := s.n.streamed.Load(), s.n.streams.Load(); st != 2 || n != 2 {
		t.Fatalf("server ran %d call(s) over %d stream(s); want 2 over 2", st, n)
	}
}
