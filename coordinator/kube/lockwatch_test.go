package kube

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestLockWatch: under both locks, a standby's view of the leader is live
// while the record changes within the lease duration (on the standby's
// clock, whatever renewTime says), and a *NoLeaderError naming the lock
// and the holder once the record has stood still longer, or when the
// lock is free or missing.
func TestLockWatch(t *testing.T) {
	for _, kind := range []string{LockLease, LockConfigMap} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			cs := fake.NewClientset()
			cfg := DefaultLeader()
			cfg.Namespace, cfg.Lock, cfg.Identity = ns, kind, "writer"
			w := NewLockWatch(cs, cfg)
			now := time.Unix(1_800_000_000, 0)
			w.now = func() time.Time { return now }
			want := kind + " " + ns + "/cutover-coordinator"

			_, err := w.Leader(ctx)
			var nl *NoLeaderError
			if !errors.As(err, &nl) || !nl.Missing || !strings.Contains(err.Error(), want+" does not exist") {
				t.Fatalf("missing lock: %v, want a NoLeaderError naming %s", err, want)
			}

			// The holder's renewTime is an hour old (its clock is off): it
			// does not matter, the record changing does.
			write := func(holder string, renew time.Time) {
				t.Helper()
				writeLock(t, ctx, cs, cfg, resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: 15,
					RenewTime: metav1.NewTime(renew), AcquireTime: metav1.NewTime(renew)})
			}
			write("coord-a", now.Add(-time.Hour))
			if l, err := w.Leader(ctx); err != nil || l != "coord-a" {
				t.Fatalf("fresh record: %q %v, want coord-a", l, err)
			}
			now = now.Add(14 * time.Second)
			write("coord-a", now.Add(-time.Hour+time.Second)) // a renewal, seen at once
			if l, err := w.Leader(ctx); err != nil || l != "coord-a" {
				t.Fatalf("just renewed: %q %v, want coord-a", l, err)
			}
			now = now.Add(14 * time.Second)
			if l, err := w.Leader(ctx); err != nil || l != "coord-a" {
				t.Fatalf("renewed 14 s ago: %q %v, want coord-a", l, err)
			}
			now = now.Add(2 * time.Second)
			_, err = w.Leader(ctx)
			if !errors.As(err, &nl) || nl.Holder != "coord-a" ||
				!strings.Contains(err.Error(), want+": its holder coord-a has not renewed it for 16s, longer than its lease duration 15s") {
				t.Fatalf("record unchanged for 16 s: %v", err)
			}

			// Released (what a leader that shuts down writes).
			write("", now)
			if _, err := w.Leader(ctx); !errors.As(err, &nl) || nl.Holder != "" || nl.Missing || !strings.Contains(err.Error(), want+" has no holder") {
				t.Fatalf("released lock: %v", err)
			}
		})
	}
}

func writeLock(t *testing.T, ctx context.Context, cs kubernetes.Interface, cfg LeaderConfig, rec resourcelock.LeaderElectionRecord) {
	t.Helper()
	if cfg.Lock == LockConfigMap {
		l := &configMapLock{client: cs.CoreV1(), namespace: cfg.Namespace, name: cfg.Name, identity: rec.HolderIdentity}
		if _, _, err := l.Get(ctx); err != nil {
			if err := l.Create(ctx, rec); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := l.Update(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return
	}
	spec := resourcelock.LeaderElectionRecordToLeaseSpec(&rec)
	leases := cs.CoordinationV1().Leases(cfg.Namespace)
	l, err := leases.Get(ctx, cfg.Name, metav1.GetOptions{})
	if err != nil {
		if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: cfg.Name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	l.Spec = spec
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
