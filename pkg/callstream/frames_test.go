package callstream_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/h2tap"
	"github.com/cutover-dev/cutover/pkg/callstream"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// callFrames makes calls Prepare calls over a call stream, one at a time,
// with the given options on each side, and counts the frames each side
// sent once the stream was open.
func callFrames(t *testing.T, calls int, sopts []grpc.ServerOption, dopts []grpc.DialOption) (client, server map[http2.FrameType]int) {
	t.Helper()
	l := bufconn.Listen(1 << 20)
	a := &agent{node: "n1"}
	a.calls = callstream.NewServer(&agentv1.AgentService_ServiceDesc, a, nil)
	s := grpc.NewServer(sopts...)
	agentv1.RegisterAgentServiceServer(s, a)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	var tap *h2tap.Conn
	cc, err := grpc.NewClient("passthrough:///agent", append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			c, err := l.DialContext(ctx)
			tap = h2tap.New(c)
			return tap, err
		})}, dopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	c := callstream.NewConn(cc, agentv1.AgentService_Calls_FullMethodName, callstream.Options{})
	defer c.Close()
	cl := agentv1.NewAgentServiceClient(c)
	ctx := ctxFor(t, 30*time.Second)
	// The connection's setup (settings, the stream's headers) and the
	// first call are not counted.
	if _, err := cl.Info(ctx, &agentv1.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	m := tap.Mark()
	for i := range calls {
		if _, err := cl.Prepare(ctx, &agentv1.PrepareRequest{OperationId: fmt.Sprint("op-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // what the last answer set off
	client, server, err = tap.Since(m)
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

// TestNoFramesBesideTheCalls: over a connection with DialOptions and
// ServerOptions, each call is one data frame each way and nothing else.
// Without them the same calls carry gRPC's bandwidth-delay pings, their
// acknowledgements and window updates: three more frames per message,
// what the options are for.
func TestNoFramesBesideTheCalls(t *testing.T) {
	const calls = 50
	c, s := callFrames(t, calls, callstream.ServerOptions(), callstream.DialOptions())
	want := map[http2.FrameType]int{http2.FrameData: calls}
	if !maps.Equal(c, want) || !maps.Equal(s, want) {
		t.Errorf("%d calls with the options: the client sent %v, the server %v; want %v each", calls, c, s, want)
	}
	c, s = callFrames(t, calls, nil, nil)
	if c[http2.FramePing] < calls || s[http2.FramePing] < calls {
		t.Errorf("%d calls without the options: the client sent %v, the server %v; want at least %d pings each (gRPC's bandwidth-delay estimation; if it no longer pings per message, the options may no longer be needed)", calls, c, s, calls)
	}
}
