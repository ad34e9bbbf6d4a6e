// Package callstreamv1 is the generated code of callstream.proto: the
// frame that carries one unary call, or its answer, over a long-lived
// stream (pkg/callstream).
package callstreamv1
