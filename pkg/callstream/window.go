package callstream

import "google.golang.org/grpc"

// Window is the HTTP/2 flow-control window, per stream and per
// connection, that DialOptions and ServerOptions fix on a connection
// carrying a call stream: far above any call's message, so that it only
// paces a peer that stops reading.
const Window = 1 << 20

// DialOptions are the dial options for a connection that carries a call
// stream, ServerOptions the server's. They fix the flow-control windows,
// which turns off gRPC's bandwidth-delay estimation.
//
// Why: with the estimation on, the receiver of a data frame
// starts a sample with a window update and a ping, which the peer
// acknowledges, whenever no sample is in flight. Calls spaced apart, the
// way an operation's rounds are, start one every time, so each message of
// a call stream cost four frames where one does: 50 calls took 200 frames
// each way instead of 50 (TestNoFramesBesideTheCalls). The estimation
// grows the window for bulk transfers; a call stream's messages are a few
// kilobytes. At 10,000 simulated agents the fixed windows cut the
// coordinator's four phases and their CPU by about a quarter
// (docs/benchmarks.md).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(Window), grpc.WithStaticConnWindowSize(Window)}
}

// ServerOptions are DialOptions' counterpart for the server.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(Window), grpc.StaticConnWindowSize(Window)}
}
