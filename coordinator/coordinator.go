// Package coordinator runs Cutover operations: it knows the agents (a
// static inventory), serves the CoordinatorService API to coordctl, and
// drives each operation's plan (prepare → commit at one instant → verify →
// confirm → finalize, or abort/rollback) by feeding the barrier core
// (internal/barrier) with the outcome of parallel gRPC calls to the agents.
// Every transition is journaled (in --state-dir, or in the cluster through
// WithJournal) so that a restarted coordinator, or a new leader, resumes or
// undoes an interrupted operation. Cluster integrations act around an
// operation through Hooks (internal/model), whose calls are journaled too.
//
// It owns no dataplane: it must never touch OVS, iptables or netlink, only
// ask agents. Decisions belong to the barrier core: what to send next,
// when to abort, and every ordering around the agents' steps (journal
// before a send, hooks before commit and after confirm, the verifier, the
// probe counters' reset and read, which hook calls a resumed run repeats).
// internal/runner performs the core's actions and feeds back their
// results, with no policy of its own. This package is the API: it
// admits a request (internal/preflight judges it), holds the single
// operation slot and the journal, creates or resumes an operation and
// hands its run to the runner. Below it, each in a package of its own
// (internal/...): runner runs an operation; preflight judges a request
// before anything changes; probes calls the agents about the probe mesh;
// opstate is one operation's bookkeeping and its report's one writer;
// fleet is the agents' clients and clocks; pathjudge, probemesh, staging
// and timing are pure judgements; config, metrics, statedir and model
// (the vocabulary, which this package re-exports) are at the bottom with
// barrier. docs/architecture.md draws the layers.
//
//	vocabulary.go  the public names of the lower packages (aliases)
//	options.go     Option and the With... options
//	coordinator.go Coordinator: build, close, the single operation slot
//	               (the runner's Slot); the agents' credentials
//	journal.go     writing an operation's record to the journal (the
//	               runner's Journal); pruning the ended ones
//	requester.go   who asked for an operation
//	held.go        staged subsets: the held operation and its continuation
//	service.go     the CoordinatorService methods and Resume
//	run.go         Server (what production and tests serve), Listen, Run
package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/preflight"
	"github.com/cutover-dev/cutover/coordinator/internal/probes"
	"github.com/cutover-dev/cutover/coordinator/internal/runner"
	"github.com/cutover-dev/cutover/coordinator/internal/statedir"
	"github.com/cutover-dev/cutover/pkg/callstream"
	"github.com/cutover-dev/cutover/pkg/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Coordinator is the coordinator's state: inventory, agent clients,
// journal, operations. Its API methods (ListAgents, Plan, Cutover, Status,
// Rollback) are served through a Server (Listen, or Serve), which routes
// every call to the Coordinator leading at the time.
type Coordinator struct {
	cfg Config

	fleet   *fleet.Fleet       // the agents: inventory, clients, clock sampling
	check   *preflight.Checker // validation and preflight of requests
	journal JournalStore
	lock    *statedir.Lock // the --state-dir lock (file journal only)
	metrics *Metrics
	log     *slog.Logger
	run     *runner.Runner // runs the operation in the slot

	ctx    context.Context // operations run under it, not under an RPC's
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	current *opstate.Op // the running operation, at most one
	ops     map[string]*opstate.Op
	pruned  map[string]bool // ids pruned from ops (and the journal) by this process
	lastID  string
	seq     int64
}

// New builds a coordinator over inv. It opens the journal (the file one in
// Config.StateDir unless WithJournal is given) but does not resume
// anything: call Resume. The file journal is locked (flock on
// <state-dir>/lock) until Close: a second coordinator on the same state
// dir gets a *StateDirLockedError naming the holder's PID.
func New(cfg Config, inv Inventory, opts ...Option) (*Coordinator, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.metrics == nil {
		o.metrics = NewMetrics()
	}
	if o.dial == nil {
		d, err := agentDialOptions(cfg, o.metrics, o.log)
		if err != nil {
			return nil, err
		}
		o.dial = d
	}
	seen := map[string]bool{}
	for i, h := range o.hooks {
		switch {
		case h == nil:
			return nil, fmt.Errorf("hook %d: nil", i)
		case h.Name() == "":
			return nil, fmt.Errorf("hook %d (%T): empty Name: the journal keys hook calls by name", i, h)
		case seen[h.Name()]:
			return nil, fmt.Errorf("hook %d (%T): name %q used by an earlier hook: names key the journal and must be unique", i, h, h.Name())
		}
		seen[h.Name()] = true
	}
	j := o.journal
	var lock *statedir.Lock
	if j == nil {
		// One coordinator per journal: a second one on the same state dir
		// would find the running operation "interrupted" and undo it
		// behind the first one's back. (A cluster journal has the Lease.)
		var err error
		if lock, err = statedir.LockDir(cfg.StateDir); err != nil {
			return nil, err
		}
		fj, err := OpenJournal(cfg.StateDir)
		if err != nil {
			lock.Release()
			return nil, err
		}
		fj.Keep = cfg.KeptOperations()
		j = fj
	}
	// Before the caller's options, which win: an agent's connection stays
	// open between operations unless cfg says otherwise (AgentIdleTimeout).
	o.dial = append([]grpc.DialOption{grpc.WithIdleTimeout(cfg.AgentIdleTimeout)}, o.dial...)
	// An open call stream keeps its connection busy: it closes after half
	// the idle timeout without a call, the connection after the rest.
	callOpts := callstream.Options{Interceptor: o.callIcpt, Idle: cfg.AgentIdleTimeout / 2}
	fl, err := fleet.New(inv, o.invSource, o.dial, callOpts, fleet.Clock{Samples: cfg.ClockSamples, GoodRTT: cfg.ClockGoodRTT, Parallel: cfg.ClockParallel}, o.log)
	if err != nil {
		lock.Release()
		return nil, err
	}
	parent := o.ctx
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	mesh := probes.New(ctx, fl, cfg.ProbeSettle, cfg.VerifyBudget, o.log)
	c := &Coordinator{cfg: cfg, fleet: fl, check: preflight.New(cfg, fl, o.hooks, o.metrics), journal: j, lock: lock, metrics: o.metrics,
		log: o.log, ctx: ctx, cancel: cancel, ops: map[string]*opstate.Op{}}
	c.run = &runner.Runner{Ctx: ctx, WG: &c.wg, Cfg: cfg, Fleet: fl, Mesh: mesh, Metrics: o.metrics, Verifier: o.verifier, Hooks: o.hooks,
		Log: o.log, Journal: journalWriter{c}, Slot: slot{c}}
	return c, nil
}

// Metrics returns the coordinator's metrics.
func (c *Coordinator) Metrics() *Metrics { return c.metrics }

// Close stops running operations where they are (the journal and the
// agents' dead-man timers take over) and closes the agent clients.
func (c *Coordinator) Close() {
	c.cancel()
	c.wg.Wait()
	c.fleet.Close()
	c.lock.Release()
}

// Wait blocks until no operation is running.
func (c *Coordinator) Wait() {
	for {
		c.mu.Lock()
		op := c.current
		c.mu.Unlock()
		if op == nil {
			return
		}
		select {
		case <-op.Finished():
		case <-time.After(10 * time.Millisecond): // in preflight: not launched yet
		}
	}
}

// reserve claims the single operation slot for op.
func (c *Coordinator) reserve(op *opstate.Op) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current != nil {
		return status.Errorf(codes.FailedPrecondition, "operation %s is running (%s): wait for it or roll it back; only one operation runs at a time",
			c.current.Rec.ID, c.current.CurPhase())
	}
	if _, dup := c.ops[op.Rec.ID]; dup {
		return status.Errorf(codes.AlreadyExists, "operation_id %q: already used: pick another id or leave it empty", op.Rec.ID)
	}
	c.current = op
	return nil
}

// claimLocked claims the slot and the core for another run of an operation
// that is not running (a rollback, a held operation's continuation), and
// marks the run started: a rollback asked from then on goes to that run,
// never to a second one. c.mu is held.
func (c *Coordinator) claimLocked(op *opstate.Op) error {
	if c.current != nil && c.current != op {
		return status.Errorf(codes.FailedPrecondition, "operation %s is running: wait for it or roll it back first", c.current.Rec.ID)
	}
	c.current = op
	op.Mu.Lock()
	op.Running = true
	op.Mu.Unlock()
	return nil
}

// slot is the coordinator's operation slot as the runner takes and frees
// it, under c.mu (runner.Slot).
type slot struct{ c *Coordinator }

func (s slot) Lock()   { s.c.mu.Lock() }
func (s slot) Unlock() { s.c.mu.Unlock() }

func (s slot) TakeLocked(op *opstate.Op) {
	s.c.ops[op.Rec.ID] = op
	s.c.lastID = op.Rec.ID
	s.c.current = op
}

func (s slot) FreeLocked(op *opstate.Op) {
	if s.c.current == op {
		s.c.current = nil
	}
}

// release frees the slot without recording op (preflight refused it).
func (c *Coordinator) release(op *opstate.Op) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == op {
		c.current = nil
	}
}

// WarmAgents opens every agent's connection in the background, so that
// the first operation after the coordinator starts (or takes over the
// lead) finds them open (fleet.Fleet.Warm); Close stops the warming.
func (c *Coordinator) WarmAgents() { c.fleet.Warm(c.ctx, &c.wg) }

// agentDialOptions returns the credentials used to dial agents: mTLS
// presenting our certificate and requiring the agent role, or plaintext
// with --insecure. Agents whose certificate is refused are counted in m.
func agentDialOptions(cfg Config, m *Metrics, log *slog.Logger) ([]grpc.DialOption, error) {
	if cfg.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	r, err := m.TLSReloader(cfg.TLS, log)
	if err != nil {
		return nil, fmt.Errorf("agent client TLS: %w", err)
	}
	tc, err := pki.ReloadingClientConfig(r, m.AgentTLSRejected, pki.RoleAgent)
	if err != nil {
		return nil, fmt.Errorf("agent client TLS: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}
