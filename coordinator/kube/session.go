package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/coordinator"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Config is the coordinator's in-cluster mode: where the agents are,
// which Lease and journal to use, and which CNI source of truth to keep
// in step.
type Config struct {
	Discovery        DiscoveryConfig
	Leader           LeaderConfig
	Journal          JournalConfig
	CNI              string // "", "flannel" or "calico": the source of truth kept in step (Session.BeforeCommit)
	FlannelNamespace string
}

// Default returns the defaults for deploy/base, with the namespace and
// identity from the downward API (POD_NAMESPACE, POD_NAME) when set.
func Default() Config {
	c := Config{Discovery: DefaultDiscovery(), Leader: DefaultLeader(), Journal: DefaultJournal(), FlannelNamespace: "kube-flannel"}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		c.Discovery.Namespace, c.Leader.Namespace, c.Journal.Namespace = ns, ns, ns
	}
	if id := os.Getenv("POD_NAME"); id != "" {
		c.Leader.Identity, c.Journal.Identity = id, id
	}
	return c
}

// AddFlags binds c to fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Discovery.Namespace, "agent-namespace", c.Discovery.Namespace, "namespace of the agent DaemonSet's pods")
	fs.StringVar(&c.Discovery.PodSelector, "agent-selector", c.Discovery.PodSelector, "label selector of the agent pods")
	fs.StringVar(&c.Discovery.NodeSelector, "node-selector", c.Discovery.NodeSelector, "label selector of the nodes a cutover must cover; empty: every node")
	fs.IntVar(&c.Discovery.AgentPort, "agent-port", c.Discovery.AgentPort, "the agents' gRPC port on the host network")
	fs.StringVar(&c.Leader.Namespace, "lease-namespace", c.Leader.Namespace, "namespace of the leader-election Lease, the journal and the Events")
	fs.StringVar(&c.Leader.Name, "lease-name", c.Leader.Name, "name of the leader-election Lease")
	fs.StringVar(&c.Leader.Lock, "leader-lock", c.Leader.Lock, "object the leader election is held on: lease (coordination.k8s.io/v1) or configmap (an annotation on ConfigMap --lease-name, for OpenShift 3.11 and other API servers before Kubernetes 1.14)")
	fs.StringVar(&c.Leader.Identity, "identity", c.Leader.Identity, "this coordinator's identity in the Lease (default $POD_NAME)")
	fs.StringVar(&c.Journal.Name, "journal-name", c.Journal.Name, "prefix of the journal's ConfigMaps")
	fs.StringVar(&c.CNI, "cni", c.CNI, `CNI source of truth moved to the new port right before the commit (and put back if the operation is undone): "flannel", "calico" or empty for none`)
	fs.StringVar(&c.FlannelNamespace, "flannel-namespace", c.FlannelNamespace, "namespace of kube-flannel-cfg (kube-flannel, or kube-system on older installs)")
}

// normalize makes the journal follow the lease's namespace and identity.
func (c *Config) normalize() {
	c.Journal.Namespace, c.Journal.Identity = c.Leader.Namespace, c.Leader.Identity
}

// Validate checks c.
func (c Config) Validate() error {
	c.normalize()
	errs := []error{c.Discovery.Validate(), c.Leader.Validate(), c.Journal.Validate()}
	switch c.CNI {
	case "", "flannel", "calico":
	default:
		errs = append(errs, fmt.Errorf("--cni %q: want flannel, calico or empty (the OpenShift ClusterNetwork has its own finalize)", c.CNI))
	}
	if c.CNI == "flannel" && c.FlannelNamespace == "" {
		errs = append(errs, errors.New("--flannel-namespace: empty with --cni=flannel"))
	}
	return errors.Join(errs...)
}

// Session is one leadership's view of the cluster: what the coordinator
// runtime is built from when this instance becomes leader, and what its
// seams call back into. Everything in it stops with the leadership's
// context.
type Session struct {
	Inventory coordinator.Inventory    // discovered at leadership start
	Journal   coordinator.JournalStore // ConfigMap journal, with milestone Events
	Source    SourceOfTruth            // nil without --cni

	discovery *Discovery
	recorder  *Recorder

	mu     sync.Mutex
	latest coordinator.Inventory // the last Refresh; Inventory until the first
}

// NewSession discovers the agents and opens the journal for a leadership
// whose context is ctx. onConflict is called when the journal finds that
// another coordinator wrote an operation since (the wiring cancels the
// coordinator there).
func NewSession(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, cfg Config, onConflict func(error), log *slog.Logger) (*Session, error) {
	cfg.normalize()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := NewDiscovery(cs, cfg.Discovery)
	if err != nil {
		return nil, err
	}
	inv, err := d.Inventory(ctx)
	if err != nil {
		return nil, err
	}
	jc := cfg.Journal
	jc.OnConflict, jc.Log = onConflict, log
	j, err := NewJournal(ctx, cs, jc)
	if err != nil {
		return nil, err
	}
	rec := NewRecorder(cs, LockRef(ctx, cs, cfg.Leader), cfg.Leader.Identity, log)
	s := &Session{Inventory: inv, latest: inv, Journal: WithMilestones(j, rec), discovery: d, recorder: rec}
	switch cfg.CNI {
	case "flannel":
		s.Source = NewFlannel(cs, cfg.FlannelNamespace)
	case "calico":
		s.Source = NewCalico(dyn)
	}
	return s, nil
}

var _ coordinator.Hook = (*Session)(nil)

// Refresh discovers the agents again: it is the coordinator's
// InventorySource (coordinator.WithInventorySource), so a node that
// joined, or whose agent became ready, after the leadership began is in
// the next plan, and a node of the overlay without a ready agent is named
// by Preflight, never left on the old port unseen.
//
// Listing on demand, not a watch: an operation starts rarely, preflight
// must judge what the API says now, and two LISTs per plan cost less than
// informers' caches, their resync and the staleness questions they raise
// (a cache that lags is what this replaces). Preflight lists once more
// and names what changed in between.
func (s *Session) Refresh(ctx context.Context) (coordinator.Inventory, error) {
	inv, err := s.discovery.Inventory(ctx)
	if err != nil {
		return coordinator.Inventory{}, err
	}
	s.mu.Lock()
	s.latest = inv
	s.mu.Unlock()
	return inv, nil
}

// Name implements coordinator.Hook; it keys the journal's hook calls.
func (s *Session) Name() string { return "cluster" }

// Preflight implements coordinator.Hook: Plan's problems.
func (s *Session) Preflight(ctx context.Context, op coordinator.OpInfo) []string {
	_, problems := s.Plan(ctx, op)
	return problems
}

// Plan implements coordinator.Planner: the cluster's objections to an
// operation moving op.Nodes off op.FromPort (targeted nodes without a
// ready agent, by name; agents that appeared or moved since the session
// began; a source of truth that disagrees with the agents) and, with a
// source of truth, what the session does to it and what it leaves to the
// admin.
func (s *Session) Plan(ctx context.Context, op coordinator.OpInfo) (steps, problems []string) {
	s.mu.Lock()
	inv := s.latest
	s.mu.Unlock()
	problems, err := s.discovery.Preflight(ctx, inv, op.Nodes)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if s.Source == nil {
		return nil, problems
	}
	desc, err := CheckSourceOfTruth(ctx, s.Source, op.FromPort)
	if err != nil {
		return nil, append(problems, err.Error())
	}
	steps = []string{desc, fmt.Sprintf("before the commit (staged: before the old port's retirement) it is set to %d; if the operation is undone, back to %d", op.ToPort, op.FromPort)}
	for _, n := range s.NextSteps(op) {
		steps = append(steps, "once the operation succeeded, the admin: "+n)
	}
	return steps, problems
}

// NextSteps implements coordinator.NextStepper: flanneld reads
// net-conf.json only when it starts, so a running flanneld still holds the
// old port and would give a flannel.1 it recreates (a device it finds
// "incompatible") the old port; restarted, it reads the new one and keeps
// the device Cutover moved, MAC included. Calico's Felix reconciles from
// FelixConfiguration while it runs: nothing to restart.
func (s *Session) NextSteps(op coordinator.OpInfo) []string {
	f, ok := s.Source.(*Flannel)
	if !ok {
		return nil
	}
	return []string{f.RestartStep(op.ToPort)}
}

// BeforeCommit implements coordinator.Hook: it points the CNI's source of
// truth at the new port once every agent is prepared, right before the
// commit instant. Why there and not at finalize:
//
//   - Calico: Felix reconciles the VXLAN device from FelixConfiguration
//     vxlanPort within seconds, so a source of truth still naming the old
//     port after the flip would make Felix move every node back. Written
//     just before the commit, the worst Felix can do is flip a node a few
//     milliseconds early, and every node already has the new port open
//     (I2 holds: BeforeCommit runs after the prepare barrier).
//   - flannel: flanneld reads net-conf.json only when it starts, so either
//     point would do; before commit keeps the window in which the
//     ConfigMap and the dataplane disagree to the commit lead on the
//     success path, where at finalize a flanneld restarting during verify
//     and confirm would rebuild its device on the old port.
//
// A staged operation (docs/staged.md) calls it later: once every node
// confirmed sending the new port, before the retirement, so that the
// source of truth never names the new port while a node still sends the
// old one (a flanneld restarting, or Felix reconciling, would move its
// node off the old port while peers send it); a held one never calls it.
//
// Restore puts the old port back if the operation then aborts or rolls
// back.
func (s *Session) BeforeCommit(ctx context.Context, op coordinator.OpInfo) error {
	if s.Source == nil {
		return nil
	}
	return s.Source.Update(ctx, op.ToPort)
}

// AfterConfirm implements coordinator.Hook: nothing to do.
func (s *Session) AfterConfirm(context.Context, coordinator.OpInfo) error { return nil }

// Finalize implements coordinator.Hook: the source of truth was updated
// before the commit; it must still say the new port (someone, or a CNI
// operator, may have written it since).
func (s *Session) Finalize(ctx context.Context, op coordinator.OpInfo) error {
	if s.Source == nil {
		return nil
	}
	_, err := CheckSourceOfTruth(ctx, s.Source, op.ToPort)
	return err
}

// Restore implements coordinator.Hook: the operation ended aborted or
// rolled back after BeforeCommit, so the source of truth goes back to the
// old port.
func (s *Session) Restore(ctx context.Context, op coordinator.OpInfo) error {
	if s.Source == nil {
		return nil
	}
	return s.Source.Restore(ctx, op.FromPort)
}

// Close flushes the session's Events.
func (s *Session) Close() { s.recorder.Close() }

// Run campaigns for the Lease with rc's credentials and, for each
// leadership, builds a Session and calls lead with the leadership's
// context. lead must stop commanding agents when that context ends (the
// coordinator: build it over the session, serve, Close at ctx.Done()).
// Journal conflicts end the leadership too. Run returns ErrLeaseLost when
// the Lease was lost: exit and let the Deployment restart the process.
func Run(ctx context.Context, rc *rest.Config, cfg Config, lead func(ctx context.Context, s *Session) error, log *slog.Logger) error {
	cfg.normalize()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if log == nil {
		log = slog.Default()
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	runCtx, stepDown := context.WithCancel(ctx)
	defer stepDown()
	var leadErr error
	e, err := NewElector(cs, cfg.Leader, func(elected context.Context) {
		// client-go keeps renewing a Lease after OnStartedLeading
		// returns: a leadership that ended on our side (lead returned, a
		// journal conflict) must give the Lease up, so the other replica
		// takes over instead of an idle leader holding it.
		defer func() {
			if elected.Err() == nil {
				stepDown()
			}
		}()
		lctx, cancel := context.WithCancel(elected)
		defer cancel()
		s, err := NewSession(lctx, cs, dyn, cfg, func(err error) {
			log.Error("journal conflict: stepping down", "err", err)
			cancel()
		}, log)
		if err != nil {
			leadErr = err
			return
		}
		defer s.Close()
		leadErr = lead(lctx, s)
	}, nil, log)
	if err != nil {
		return err
	}
	if err := e.Run(runCtx); err != nil {
		return errors.Join(err, leadErr)
	}
	return leadErr
}
