// Package callstream carries a gRPC service's unary calls over one
// long-lived bidirectional stream per connection, a frame per call or
// answer (proto/callstream/v1), instead of an HTTP/2 stream per call.
//
// Why: a unary call costs both ends a new stream (headers both ways,
// trailers, a server goroutine, a flush) whatever its message. The
// coordinator makes about ten calls per agent per operation, and at 10,000
// agents that per-call cost bounds its phases on a small machine
// (docs/benchmarks.md). Over a stream a call costs a frame each way.
//
// A call keeps the unary call's meaning: the server runs the method's
// generated handler, with the server's interceptor, under a context that
// carries the caller's remaining deadline and is cancelled when the caller
// gives up or the stream ends; the answer carries the handler's status
// code and message. A client whose server has no stream method (an older
// agent) falls back to unary calls (Conn).
package callstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	callstreamv1 "github.com/cutover-dev/cutover/proto/callstream/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// acceptKey is the header a Server sends as it takes a stream: a client
// then knows its frames reach a handler (an older server answers the
// stream method UNIMPLEMENTED, with no header).
const acceptKey = "cutover-callstream"

// Server serves the unary methods of one service over call streams.
type Server struct {
	impl        any
	interceptor grpc.UnaryServerInterceptor
	methods     map[string]grpc.MethodDesc // by full method name

	drainOnce sync.Once
	drain     chan struct{} // closed by Drain
}

// NewServer serves desc's unary methods, implemented by impl (what
// desc's Register function is given), through interceptor (nil: none),
// the one the server's unary calls go through: a call counts the same
// either way.
func NewServer(desc *grpc.ServiceDesc, impl any, interceptor grpc.UnaryServerInterceptor) *Server {
	s := &Server{impl: impl, interceptor: interceptor, methods: map[string]grpc.MethodDesc{}, drain: make(chan struct{})}
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = m
	}
	return s
}

// Drain ends every stream once the calls it runs have answered, and every
// stream opened later at once: call it before the gRPC server's
// GracefulStop, which otherwise waits for the streams (long-lived, they
// would never end on their own). A client's later calls open a new stream
// on another connection, or fail UNAVAILABLE as unary calls to a stopping
// server do.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.drain) }) }

// Serve answers the calls arriving on st until the client closes it or
// Drain, then waits for the calls still running (their context ends with
// the stream's, as a unary call's does when its client goes away). It is
// the body of the service's stream method.
func (s *Server) Serve(st grpc.BidiStreamingServer[callstreamv1.Frame, callstreamv1.Frame]) error {
	select {
	case <-s.drain:
		return status.Error(codes.Unavailable, "server stopping")
	default:
	}
	if err := st.SendHeader(metadata.Pairs(acceptKey, "1")); err != nil {
		return err
	}
	ctx := st.Context()
	var (
		mu      sync.Mutex
		running = map[uint64]context.CancelFunc{}
		sendMu  sync.Mutex
		wg      sync.WaitGroup
	)
	defer wg.Wait()
	send := func(f *callstreamv1.Frame) {
		sendMu.Lock()
		defer sendMu.Unlock()
		// A send fails only once the stream is gone: the client no longer
		// waits for this answer.
		_ = st.Send(f)
	}
	type received struct {
		f   *callstreamv1.Frame
		err error
	}
	recv := make(chan received)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			f, err := st.Recv()
			select {
			case recv <- received{f, err}:
			case <-quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r received
		select {
		case r = <-recv:
		case <-s.drain:
			return nil
		}
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			return r.err
		}
		f := r.f
		if f.Cancel {
			mu.Lock()
			if cancel := running[f.Id]; cancel != nil {
				cancel()
			}
			mu.Unlock()
			continue
		}
		md, ok := s.methods[f.Method]
		if !ok {
			send(&callstreamv1.Frame{Id: f.Id, Code: int32(codes.Unimplemented), Message: fmt.Sprintf("method %q not served on this stream", f.Method)})
			continue
		}
		var cctx context.Context
		var cancel context.CancelFunc
		if f.TimeoutNanos > 0 {
			cctx, cancel = context.WithTimeout(ctx, time.Duration(f.TimeoutNanos))
		} else {
			cctx, cancel = context.WithCancel(ctx)
		}
		mu.Lock()
		running[f.Id] = cancel
		mu.Unlock()
		wg.Go(func() {
			out := s.call(cctx, md, f)
			mu.Lock()
			delete(running, f.Id)
			mu.Unlock()
			cancel()
			send(out)
		})
	}
}

// call runs one call's handler and frames its answer.
func (s *Server) call(ctx context.Context, md grpc.MethodDesc, f *callstreamv1.Frame) *callstreamv1.Frame {
	out := &callstreamv1.Frame{Id: f.Id}
	dec := func(m any) error {
		pm, ok := m.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "request %T is not a protobuf message", m)
		}
		if err := proto.Unmarshal(f.Payload, pm); err != nil {
			return status.Errorf(codes.InvalidArgument, "request of %s: %v", f.Method, err)
		}
		return nil
	}
	resp, err := md.Handler(s.impl, ctx, dec, s.interceptor)
	if err == nil {
		pm, ok := resp.(proto.Message)
		if !ok {
			err = status.Errorf(codes.Internal, "response %T is not a protobuf message", resp)
		} else if out.Payload, err = proto.Marshal(pm); err != nil {
			err = status.Errorf(codes.Internal, "response of %s: %v", f.Method, err)
		}
	}
	if err != nil {
		// As gRPC makes a unary call's status: a context error is its code.
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		out.Payload, out.Code, out.Message = nil, int32(st.Code()), st.Message()
		if len(st.Details()) > 0 {
			// Marshalling a status proto cannot fail short of a bug; the
			// code and message still travel without its details.
			out.StatusDetails, _ = proto.Marshal(st.Proto())
		}
	}
	return out
}
