package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func fastLeader(id string) LeaderConfig {
	c := DefaultLeader()
	c.Identity = id
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 1500*time.Millisecond, time.Second, 100*time.Millisecond
	return c
}

// leading runs an Elector for id and reports its leadership on the
// returned channels.
type leading struct {
	started chan context.Context
	stopped chan struct{}
	done    chan error
	cancel  context.CancelFunc
	e       *Elector
}

func runElector(t *testing.T, cs kubernetes.Interface, id string, work func(ctx context.Context)) *leading {
	t.Helper()
	l := &leading{started: make(chan context.Context, 1), stopped: make(chan struct{}), done: make(chan error, 1)}
	var once sync.Once
	e, err := NewElector(cs, fastLeader(id), func(ctx context.Context) {
		l.started <- ctx
		if work != nil {
			work(ctx)
		}
	}, func() { once.Do(func() { close(l.stopped) }) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.e = e
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() { l.done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-l.done })
	return l
}

func waitCtx(t *testing.T, ch <-chan context.Context, what string) context.Context {
	t.Helper()
	select {
	case ctx := <-ch:
		return ctx
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: never became leader", what)
	}
	return nil
}

func TestElectorHandOverOnRelease(t *testing.T) {
	cs := fake.NewClientset()
	a := runElector(t, cs, "coord-a", nil)
	actx := waitCtx(t, a.started, "coord-a")
	b := runElector(t, cs, "coord-b", nil)
	select {
	case <-b.started:
		t.Fatal("two leaders")
	case <-time.After(500 * time.Millisecond):
	}
	if !a.e.IsLeader() || b.e.Leader() != "coord-a" {
		t.Errorf("leader %q, a leads %t", b.e.Leader(), a.e.IsLeader())
	}
	a.cancel()
	if err := <-a.done; err != nil {
		t.Errorf("clean stop: %v", err)
	}
	a.done <- nil // for Cleanup
	if actx.Err() == nil {
		t.Error("the old leader's context is still live")
	}
	<-a.stopped
	// ReleaseOnCancel: b takes over well before the lease would expire.
	start := time.Now()
	waitCtx(t, b.started, "coord-b")
	t.Logf("hand-over took %s", time.Since(start))
}

func TestElectorLostLeaseCancelsWork(t *testing.T) {
	cs := fake.NewClientset()
	var failing sync.Mutex
	broken := false
	cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		failing.Lock()
		defer failing.Unlock()
		if broken {
			return true, nil, errors.New("apiserver unreachable")
		}
		return false, nil, nil
	})
	workEnded := make(chan time.Time, 1)
	a := runElector(t, cs, "coord-a", func(ctx context.Context) {
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // the coordinator's Close
		workEnded <- time.Now()
	})
	waitCtx(t, a.started, "coord-a")
	failing.Lock()
	broken = true
	failing.Unlock()
	err := <-a.done
	a.done <- nil
	returned := time.Now()
	if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "identity coord-a") {
		t.Fatalf("Run = %v, want ErrLeaseLost", err)
	}
	select {
	case ended := <-workEnded:
		if ended.After(returned) {
			t.Error("Run returned before the leader's work stopped")
		}
	default:
		t.Error("Run returned while the leader's work was still running")
	}
}

func TestLeaderConfigValidate(t *testing.T) {
	c := fastLeader("")
	c.RenewDeadline = 2 * time.Second
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "leader identity: empty") || !strings.Contains(err.Error(), "want 0 < retry period < renew deadline < lease duration") {
		t.Errorf("Validate() = %v", err)
	}
}

func TestLeaderConfigLockValidated(t *testing.T) {
	c := fastLeader("coord-a")
	for _, ok := range []string{"", LockLease, LockConfigMap} {
		c.Lock = ok
		if err := c.Validate(); err != nil {
			t.Errorf("lock %q: %v", ok, err)
		}
	}
	c.Lock = "endpoints" // client-go's other removed lock: not offered
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), `--leader-lock "endpoints"`) || !strings.Contains(err.Error(), "OpenShift 3.11") {
		t.Fatalf("Validate = %v, want the flag, the value and the choices", err)
	}
	if _, err := NewElector(fake.NewClientset(), c, func(context.Context) {}, nil, nil); err == nil {
		t.Fatal("NewElector accepted an unknown lock")
	}
}
