package kube

import (
	"bytes"
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// NoLeaderError says why the leader lock has no live holder: it is free
// (a leader that shut down released it, or nobody ever took it), or its
// holder stopped renewing it for longer than its lease duration.
type NoLeaderError struct {
	Lock      string        // "lease NS/NAME" or "configmap NS/NAME"
	Missing   bool          // the object does not exist
	Holder    string        // "" when the lock is free
	Unchanged time.Duration // how long the record has not changed, on this replica's clock
	Duration  time.Duration // the holder's lease duration
}

func (e *NoLeaderError) Error() string {
	if e.Missing {
		return fmt.Sprintf("%s does not exist: no coordinator has taken it (can the replicas create it? deploy/base/rbac.yaml; --leader-lock must match what the API server serves)", e.Lock)
	}
	if e.Holder == "" {
		return fmt.Sprintf("%s has no holder (released by a leader that stopped, or never taken): no coordinator leads", e.Lock)
	}
	return fmt.Sprintf("%s: its holder %s has not renewed it for %s, longer than its lease duration %s: no coordinator leads (is pod %s running and reaching the API server?)",
		e.Lock, e.Holder, e.Unchanged.Round(time.Second), e.Duration, e.Holder)
}

// lockName is how errors name the lock cfg describes.
func lockName(cfg LeaderConfig) string {
	kind := "lease"
	if cfg.Lock == LockConfigMap {
		kind = "configmap"
	}
	return kind + " " + cfg.Namespace + "/" + cfg.Name
}

// LockWatch tells a standby which replica leads now, and whether it is
// alive. It judges liveness as client-go's elector does: by how long the
// record has gone unchanged on this replica's clock, not by the holder's
// renewTime, which was written by another node's clock. A replica that
// starts next to a dead holder therefore calls it live for one lease
// duration, as its elector does before it takes over. Not safe for
// concurrent use.
type LockWatch struct {
	client kubernetes.Interface
	cfg    LeaderConfig
	now    func() time.Time

	raw     []byte    // the record last read
	changed time.Time // when raw was first read as it is
}

// NewLockWatch follows the lock cfg names (cfg.Identity is not used).
func NewLockWatch(client kubernetes.Interface, cfg LeaderConfig) *LockWatch {
	return &LockWatch{client: client, cfg: cfg, now: time.Now}
}

// Leader reads the lock and returns its holder when it is live; otherwise
// a *NoLeaderError, or the error reading the lock (naming it).
func (w *LockWatch) Leader(ctx context.Context) (string, error) {
	cfg := w.cfg
	if cfg.Identity == "" {
		cfg.Identity = "lockwatch" // newLock requires one; reads do not use it
	}
	lock, err := newLock(w.client, cfg)
	if err != nil {
		return "", err
	}
	rec, raw, err := lock.Get(ctx)
	switch {
	case apierrors.IsNotFound(err):
		return "", &NoLeaderError{Lock: lockName(w.cfg), Missing: true}
	case err != nil:
		return "", fmt.Errorf("reading %s: %w", lockName(w.cfg), err)
	}
	now := w.now()
	if w.changed.IsZero() || !bytes.Equal(raw, w.raw) {
		w.raw, w.changed = raw, now
	}
	return liveHolder(w.cfg, rec, now.Sub(w.changed))
}

// liveHolder is rec's holder if its record, unchanged for that long, is
// still within its lease duration.
func liveHolder(cfg LeaderConfig, rec *resourcelock.LeaderElectionRecord, unchanged time.Duration) (string, error) {
	d := time.Duration(rec.LeaseDurationSeconds) * time.Second
	if d <= 0 {
		d = cfg.LeaseDuration
	}
	if rec.HolderIdentity == "" || unchanged > d {
		return "", &NoLeaderError{Lock: lockName(cfg), Holder: rec.HolderIdentity, Unchanged: unchanged, Duration: d}
	}
	return rec.HolderIdentity, nil
}
