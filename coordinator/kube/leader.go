package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderConfig says which Lease to hold and how.
type LeaderConfig struct {
	Namespace string
	Name      string // the Lease (or ConfigMap, with Lock LockConfigMap)
	Identity  string // the pod name
	// Lock is the object the record is kept on: LockLease (default) or
	// LockConfigMap for API servers without coordination.k8s.io (OpenShift
	// 3.11).
	Lock          string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// DefaultLeader returns client-go's usual timings.
func DefaultLeader() LeaderConfig {
	return LeaderConfig{Namespace: "cutover", Name: "cutover-coordinator", Lock: LockLease, LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
}

// Validate checks c; the timing rules are client-go's, said in our words.
func (c LeaderConfig) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("lease namespace: empty"))
	}
	if c.Name == "" {
		errs = append(errs, errors.New("lease name: empty"))
	}
	if c.Identity == "" {
		errs = append(errs, errors.New("leader identity: empty: give the pod name (POD_NAME from the downward API)"))
	}
	switch c.Lock {
	case "", LockLease, LockConfigMap:
	default:
		errs = append(errs, fmt.Errorf("--leader-lock %q: want %s (coordination.k8s.io/v1 Lease) or %s (a ConfigMap's annotation, for OpenShift 3.11 / Kubernetes before 1.14)", c.Lock, LockLease, LockConfigMap))
	}
	if c.RetryPeriod <= 0 || c.RenewDeadline <= c.RetryPeriod || c.LeaseDuration <= c.RenewDeadline {
		errs = append(errs, fmt.Errorf("lease timings %s/%s/%s: want 0 < retry period < renew deadline < lease duration",
			c.RetryPeriod, c.RenewDeadline, c.LeaseDuration))
	}
	return errors.Join(errs...)
}

// ErrLeaseLost is returned by Elector.Run when this coordinator led and
// then lost its Lease. The process should exit and start again as a
// follower: its in-memory state may be stale.
var ErrLeaseLost = errors.New("leader election: lease lost")

// Elector runs a function while this coordinator holds the Lease.
type Elector struct {
	le  *leaderelection.LeaderElector
	cfg LeaderConfig
	log *slog.Logger

	started  func(context.Context)
	stopped  func()
	acquired atomic.Bool // set by the lock, before onStarted is spawned
	leadDone chan struct{}
}

// watchedLock notes the first successful write of our own identity: from
// that moment the elector will spawn onStarted, so Run must wait for it.
// (client-go spawns onStarted in a goroutine and offers no other way to
// know it will.)
type watchedLock struct {
	resourcelock.Interface
	acquired *atomic.Bool
}

func (l watchedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}

func (l watchedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}

// NewElector prepares leader election on cfg's Lease. onStarted runs
// (in its own goroutine) when this instance becomes leader; its context is
// cancelled the moment the Lease is lost or not renewed in time, and
// everything that commands agents must derive from it. onStopped runs
// after that (also when it never led).
func NewElector(client kubernetes.Interface, cfg LeaderConfig, onStarted func(ctx context.Context), onStopped func(), log *slog.Logger) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	e := &Elector{cfg: cfg, log: log, started: onStarted, stopped: onStopped, leadDone: make(chan struct{})}
	lock, err := newLock(client, cfg)
	if err != nil {
		return nil, err
	}
	e.le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          watchedLock{Interface: lock, acquired: &e.acquired},
		LeaseDuration: cfg.LeaseDuration,
		RenewDeadline: cfg.RenewDeadline,
		RetryPeriod:   cfg.RetryPeriod,
		// Giving the Lease up on a clean shutdown lets the other replica
		// take over at once instead of after LeaseDuration.
		ReleaseOnCancel: true,
		Name:            cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: e.onStarted,
			OnStoppedLeading: func() {
				log.Info("leader election: stopped leading", "identity", cfg.Identity)
				if e.stopped != nil {
					e.stopped()
				}
			},
			OnNewLeader: func(id string) { log.Info("leader election: leader", "leader", id, "me", id == cfg.Identity) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	return e, nil
}

// newLock builds the lock cfg.Lock names.
func newLock(client kubernetes.Interface, cfg LeaderConfig) (resourcelock.Interface, error) {
	if cfg.Lock == LockConfigMap {
		return &configMapLock{client: client.CoreV1(), namespace: cfg.Namespace, name: cfg.Name, identity: cfg.Identity}, nil
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.Namespace, cfg.Name, client.CoreV1(), client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: cfg.Identity})
	if err != nil {
		return nil, fmt.Errorf("leader election: lease %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	return lock, nil
}

// Holder reads who holds the lock cfg names now ("" when free), for a
// standby that must say who leads.
func Holder(ctx context.Context, client kubernetes.Interface, cfg LeaderConfig) (string, error) {
	lock, err := newLock(client, cfg)
	if err != nil {
		return "", err
	}
	rec, _, err := lock.Get(ctx)
	if err != nil {
		return "", err
	}
	return rec.HolderIdentity, nil
}

// LockRef is the lock object, for Events' involvedObject.
func LockRef(ctx context.Context, client kubernetes.Interface, cfg LeaderConfig) corev1.ObjectReference {
	if cfg.Lock != LockConfigMap {
		return LeaseRef(ctx, client, cfg.Namespace, cfg.Name)
	}
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: cfg.Namespace, Name: cfg.Name}
	if cm, err := client.CoreV1().ConfigMaps(cfg.Namespace).Get(ctx, cfg.Name, metav1.GetOptions{}); err == nil {
		ref.UID = cm.UID
	}
	return ref
}

func (e *Elector) onStarted(ctx context.Context) {
	defer close(e.leadDone)
	e.log.Info("leader election: started leading", "identity", e.cfg.Identity, "lease", e.cfg.Namespace+"/"+e.cfg.Name)
	e.started(ctx)
}

// Run campaigns for the Lease and leads until ctx ends or the Lease is
// lost. It returns only after onStarted returned, so nothing of this
// leadership outlives Run. It returns nil when ctx ended, ErrLeaseLost
// when the Lease was lost. An Elector runs once.
func (e *Elector) Run(ctx context.Context) error {
	e.le.Run(ctx)
	led := e.acquired.Load()
	if led {
		<-e.leadDone
	}
	if ctx.Err() == nil && led {
		return fmt.Errorf("%w (%s/%s, identity %s)", ErrLeaseLost, e.cfg.Namespace, e.cfg.Name, e.cfg.Identity)
	}
	return nil
}

// Leader returns the identity of the last observed leader.
func (e *Elector) Leader() string { return e.le.GetLeader() }

// IsLeader reports whether this instance holds the Lease now.
func (e *Elector) IsLeader() bool { return e.le.IsLeader() }
