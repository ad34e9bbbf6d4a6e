package callstream

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	callstreamv1 "github.com/cutover-dev/cutover/proto/callstream/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// callDesc describes a call stream: both sides stream.
var callDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// recheckUnary is how long a client whose server had no stream method
// calls it unary before asking again: an agent upgraded meanwhile then
// gets the stream.
const recheckUnary = time.Minute

// Conn is a grpc.ClientConnInterface (what generated clients take) that
// sends unary calls over one stream on cc, opened at the first call and
// again after it breaks. Streaming calls, calls with call options (other
// than the generated clients' StaticMethod), and every call while the
// server has no stream method go to cc unary.
type Conn struct {
	cc     *grpc.ClientConn
	method string // the stream method's full name

	interceptor grpc.UnaryClientInterceptor // nil: none
	idle        time.Duration

	ctx    context.Context // the streams' lifetime: until Close
	cancel context.CancelFunc

	mu        sync.Mutex
	cur       *stream
	opening   chan struct{} // closed when the open under way ends
	openErr   error         // its error (nil: cur is open)
	unaryTill time.Time     // the server had no stream method: unary until then
}

// Options are a Conn's.
type Options struct {
	// Interceptor runs every call, as cc's own unary interceptors would
	// (those run only for the calls that go unary). Nil: none.
	Interceptor grpc.UnaryClientInterceptor
	// Idle closes the stream after this long without a call running, so
	// that cc can go idle (grpc.WithIdleTimeout: an open stream keeps a
	// connection busy); the next call opens another. 0: keep it open.
	Idle time.Duration
}

// NewConn sends the unary calls made through it over method, a
// bidirectional stream method served by a Server, on cc. Close ends its
// stream; cc stays the caller's.
func NewConn(cc *grpc.ClientConn, method string, o Options) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &Conn{cc: cc, method: method, interceptor: o.Interceptor, idle: o.Idle, ctx: ctx, cancel: cancel}
}

// Close ends the stream: calls still waiting fail with CANCELED.
func (c *Conn) Close() { c.cancel() }

// NewStream is cc's: only unary calls go over the call stream.
func (c *Conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(ctx, desc, method, opts...)
}

// notStatic: an option other than the StaticMethod every generated
// client passes, which says only that the method name is a constant.
func notStatic(o grpc.CallOption) bool {
	_, ok := o.(grpc.StaticMethodCallOption)
	return !ok
}

var (
	// errUnary says the server has no stream method: the call goes unary.
	errUnary = errors.New("callstream: server has no call stream")
	// errIdle ends a stream closed for idleness (Options.Idle).
	errIdle = errors.New("callstream: stream closed after idling")
)

// Invoke makes one unary call over the stream, or unary on cc when the
// server has no stream method or the call has options.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if c.interceptor != nil {
		return c.interceptor(ctx, method, args, reply, c.cc, c.invoke, opts...)
	}
	return c.invoke(ctx, method, args, reply, c.cc, opts...)
}

// invoke is Invoke's call, a grpc.UnaryInvoker (cc is c.cc).
func (c *Conn) invoke(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	if slices.ContainsFunc(opts, notStatic) {
		return c.cc.Invoke(ctx, method, args, reply, opts...)
	}
	req, ok1 := args.(proto.Message)
	resp, ok2 := reply.(proto.Message)
	if !ok1 || !ok2 {
		return c.cc.Invoke(ctx, method, args, reply)
	}
	for {
		st, err := c.stream(ctx)
		if errors.Is(err, errUnary) {
			return c.cc.Invoke(ctx, method, args, reply)
		}
		if err != nil {
			return err
		}
		// A stream closed for idleness between stream and call: the
		// call was not sent; the next stream takes it.
		if err := st.call(ctx, method, req, resp); !errors.Is(err, errIdle) {
			return err
		}
	}
}

// Open opens the stream ahead of the first call (the coordinator warms its
// agent connections so): nil also when the server has no stream method.
func (c *Conn) Open(ctx context.Context) error {
	_, err := c.stream(ctx)
	if errors.Is(err, errUnary) {
		return nil
	}
	return err
}

// stream returns the open stream, opening one if there is none; one open
// at a time, which a caller stops waiting for when its ctx ends (the open
// goes on for the next caller).
func (c *Conn) stream(ctx context.Context) (*stream, error) {
	for {
		c.mu.Lock()
		switch {
		case time.Now().Before(c.unaryTill):
			c.mu.Unlock()
			return nil, errUnary
		case c.cur != nil && !c.cur.broken():
			st := c.cur
			c.mu.Unlock()
			return st, nil
		case c.opening == nil:
			c.opening = make(chan struct{})
			go c.open(c.opening)
		}
		opening := c.opening
		c.mu.Unlock()
		select {
		case <-opening:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		c.mu.Lock()
		err := c.openErr
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// open opens a stream and waits for the server to take it: its header, or
// UNIMPLEMENTED from a server without the method.
func (c *Conn) open(done chan struct{}) {
	st, err := c.dial()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opening, c.openErr = nil, err
	switch {
	case errors.Is(err, errUnary):
		c.unaryTill = time.Now().Add(recheckUnary)
	case err == nil:
		c.cur = st
	}
	close(done)
}

func (c *Conn) dial() (*stream, error) {
	ctx, cancel := context.WithCancel(c.ctx)
	cs, err := c.cc.NewStream(ctx, callDesc, c.method)
	if err != nil {
		cancel()
		return nil, err
	}
	st, err := c.accepted(cs)
	if err != nil {
		cancel()
		return nil, err
	}
	st.cancel, st.idle = cancel, c.idle
	go st.receive()
	go st.sendLoop()
	return st, nil
}

// accepted waits for the server to take cs: its header, or its status.
func (c *Conn) accepted(cs grpc.ClientStream) (*stream, error) {
	md, _ := cs.Header()
	if len(md.Get(acceptKey)) == 0 {
		// No header: the stream ended before a handler took it. Its
		// status says why.
		err := cs.RecvMsg(new(callstreamv1.Frame))
		if status.Code(err) == codes.Unimplemented {
			return nil, errUnary
		}
		if err == nil {
			err = status.Error(codes.Internal, "call stream: server sent a frame before taking the stream")
		}
		return nil, err
	}
	return &stream{cs: cs, waiting: map[uint64]chan *callstreamv1.Frame{}, queue: make(chan outgoing, 64), done: make(chan struct{})}, nil
}

// stream is one open call stream.
type stream struct {
	cs     grpc.ClientStream
	cancel context.CancelFunc // ends cs
	queue  chan outgoing
	idle   time.Duration // Options.Idle

	mu       sync.Mutex
	next     uint64
	waiting  map[uint64]chan *callstreamv1.Frame
	running  int           // calls under way
	idleTime *time.Timer   // closes it once idle long enough
	err      error         // why it broke
	done     chan struct{} // closed when it broke
}

// outgoing is a frame waiting to be sent, with the context of its call:
// a call its caller has given up on by then is not sent.
type outgoing struct {
	ctx context.Context
	f   *callstreamv1.Frame
}

func (s *stream) broken() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// fail marks the stream broken with err and fails every waiting call.
func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(err)
}

func (s *stream) failLocked(err error) {
	if s.err != nil {
		return
	}
	s.err = err
	close(s.done)
	for id, ch := range s.waiting {
		delete(s.waiting, id)
		close(ch)
	}
	if s.cancel != nil {
		s.cancel()
	}
}

// begin counts a call under way; end counts it done, and arms the idle
// close when it was the last.
func (s *stream) beginLocked() {
	s.running++
	if s.idleTime != nil {
		s.idleTime.Stop()
	}
}

func (s *stream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if s.running > 0 || s.idle <= 0 || s.err != nil {
		return
	}
	if s.idleTime == nil {
		s.idleTime = time.AfterFunc(s.idle, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.running == 0 {
				s.failLocked(errIdle)
			}
		})
		return
	}
	s.idleTime.Reset(s.idle)
}

// receive hands each answer to its call until the stream breaks.
func (s *stream) receive() {
	for {
		f := new(callstreamv1.Frame)
		if err := s.cs.RecvMsg(f); err != nil {
			s.fail(err)
			return
		}
		s.mu.Lock()
		ch := s.waiting[f.Id]
		delete(s.waiting, f.Id)
		s.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	}
}

// sendLoop sends the queued frames in order. The deadline a call frame
// carries is measured as it leaves, as gRPC measures grpc-timeout; a call
// whose caller gave up while queued is not sent.
func (s *stream) sendLoop() {
	for {
		var o outgoing
		select {
		case o = <-s.queue:
		case <-s.done:
			return
		}
		if o.f.Method != "" {
			if o.ctx.Err() != nil {
				continue
			}
			if dl, ok := o.ctx.Deadline(); ok {
				o.f.TimeoutNanos = max(1, time.Until(dl).Nanoseconds())
			}
		}
		if err := s.cs.SendMsg(o.f); err != nil {
			// The answer to a send error is the stream's status, which
			// receive gets.
			return
		}
	}
}

// enqueue queues f, unless the stream broke or ctx ended first.
func (s *stream) enqueue(ctx context.Context, f *callstreamv1.Frame) error {
	select {
	case s.queue <- outgoing{ctx: ctx, f: f}:
		return nil
	case <-s.done:
		return s.brokenErr()
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// brokenErr is the error of a call the stream's end failed: UNAVAILABLE
// (a unary call on a connection that broke gets it too), or the stream's
// status when it has one.
func (s *stream) brokenErr() error {
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	return status.Errorf(codes.Unavailable, "call stream ended: %v", err)
}

// call makes one call and waits for its answer, the stream's end, or ctx.
func (s *stream) call(ctx context.Context, method string, req, resp proto.Message) error {
	payload, err := proto.Marshal(req)
	if err != nil {
		return status.Errorf(codes.Internal, "request of %s: %v", method, err)
	}
	ch := make(chan *callstreamv1.Frame, 1)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		if errors.Is(err, errIdle) {
			return errIdle
		}
		return s.brokenErr()
	}
	s.beginLocked()
	defer s.end()
	s.next++
	id := s.next
	s.waiting[id] = ch
	s.mu.Unlock()
	if err := s.enqueue(ctx, &callstreamv1.Frame{Id: id, Method: method, Payload: payload}); err != nil {
		s.forget(id)
		return err
	}
	select {
	case f, ok := <-ch:
		if !ok {
			return s.brokenErr()
		}
		if f.Code != 0 {
			if len(f.StatusDetails) > 0 {
				var sp spb.Status
				if err := proto.Unmarshal(f.StatusDetails, &sp); err == nil && sp.GetCode() == f.Code {
					return status.ErrorProto(&sp)
				}
			}
			return status.Error(codes.Code(f.Code), f.Message)
		}
		if err := proto.Unmarshal(f.Payload, resp); err != nil {
			return status.Errorf(codes.Internal, "response of %s: %v", method, err)
		}
		return nil
	case <-ctx.Done():
		s.forget(id)
		// Tell the server, as a unary call's RST_STREAM would: its
		// handler's context ends. Best effort, and not held up by ctx.
		select {
		case s.queue <- outgoing{ctx: context.Background(), f: &callstreamv1.Frame{Id: id, Cancel: true}}:
		default:
		}
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (s *stream) forget(id uint64) {
	s.mu.Lock()
	delete(s.waiting, id)
	s.mu.Unlock()
}
