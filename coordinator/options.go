package coordinator

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
)

// Option changes how New builds a Coordinator.
type Option func(*options)

type options struct {
	dial     []grpc.DialOption
	callIcpt grpc.UnaryClientInterceptor
	verifier Verifier
	log      *slog.Logger
	metrics  *Metrics
	journal  JournalStore
	ctx      context.Context
	hooks    []Hook

	invSource InventorySource
}

var _ JournalStore = (*Journal)(nil)

// WithJournal keeps the journal in j instead of --state-dir (which is then
// not opened, and not needed).
func WithJournal(j JournalStore) Option { return func(x *options) { x.journal = j } }

// WithContext derives the coordinator's context (under which operations
// call agents and hooks) from ctx: when ctx ends, e.g. the leadership's
// context when the Lease is lost, every call stops at once and operations
// stay where they are, for the journal's next reader to finish or undo.
func WithContext(ctx context.Context) Option { return func(x *options) { x.ctx = ctx } }

// WithHook adds a Hook; several may be given, and are called in the order
// given (Restore in reverse). Names must be unique: they key the journal.
func WithHook(h Hook) Option { return func(x *options) { x.hooks = append(x.hooks, h) } }

// WithDialOptions sets the options used to dial agents (credentials, a
// custom dialer for tests). Without it New dials with mTLS from
// Config.TLS, or plaintext with Config.Insecure.
func WithDialOptions(o ...grpc.DialOption) Option {
	return func(x *options) { x.dial = append(x.dial, o...) }
}

// WithAgentCallInterceptor runs every call to an agent through i,
// those over the agent's call stream (pkg/callstream) included, which a
// unary interceptor among the dial options does not see.
func WithAgentCallInterceptor(i grpc.UnaryClientInterceptor) Option {
	return func(x *options) { x.callIcpt = i }
}

// WithVerifier adds an operation-wide verification after the read-back.
func WithVerifier(v Verifier) Option { return func(x *options) { x.verifier = v } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(x *options) { x.log = l } }

// WithMetrics uses m instead of a fresh set of metrics.
func WithMetrics(m *Metrics) Option { return func(x *options) { x.metrics = m } }

// WithInventorySource makes the inventory follow src: New's inventory is
// the first one, and Plan, Cutover, Rollback and ListAgents read src again
// first. Without it the inventory is fixed (the static one).
func WithInventorySource(src InventorySource) Option {
	return func(x *options) { x.invSource = src }
}
