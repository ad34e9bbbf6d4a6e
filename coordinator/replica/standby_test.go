package replica

// A standby's readiness follows the leader lock, under both locks, on a
// real kube-apiserver: Ready while a live replica leads (both replicas
// Ready, as the rolling update needs), 503 naming the lock when it is
// missing or its holder stopped renewing it, and the leader gauge says
// which replica leads.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/harness/kubetest"
)

func TestStandbyReadyOnlyWithALiveLeader(t *testing.T) {
	kubetest.RequireKustomize(t)
	c := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	installRBAC(t, c, admin)
	ip := "198.18.0.1"
	mkNodeWithAgent(t, admin, "n1", ip)
	l := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	fakeagent.Register(s, fakeagent.New("n1", 4789))
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if addr == ip+":9443" {
			return l.DialContext(ctx)
		}
		return nil, fmt.Errorf("no test agent at %s", addr)
	})
	sa := c.ServiceAccount(ns, "cutover-coordinator")

	for i, lock := range []string{kube.LockLease, kube.LockConfigMap} {
		t.Run(lock, func(t *testing.T) {
			name := "cutover-coordinator-" + lock
			opt := func(k *kube.Config) { k.Leader.Lock, k.Leader.Name, k.CNI = lock, name, "" }
			want := lock + " " + ns + "/" + name
			port := sharedPort(t)
			// B cannot write the lock (its writes are refused, as when its
			// RBAC or its way to the apiserver is broken): it stays a
			// standby whatever happens to the leader.
			b := newReplica(t, admin, sa, "sb-"+lock, fmt.Sprintf("127.0.0.%d:%s", 10+2*i, port), dial, opt)
			b.net.readOnly.Store(true)
			b.start(ctx)
			waitFor(t, "B unready: no lock yet", 10*time.Second, func() bool {
				code, body := b.readyz()
				return code == http.StatusServiceUnavailable && strings.Contains(body, want+" does not exist")
			})
			if code, body := b.readyz(); !strings.Contains(body, "sb-"+lock+" is a standby and no replica leads") {
				t.Errorf("B /readyz without a lock: %d %q, want it to say that no replica leads", code, body)
			}

			a := startReplica(t, ctx, admin, sa, "la-"+lock, fmt.Sprintf("127.0.0.%d:%s", 11+2*i, port), dial, opt)
			waitFor(t, "A to lead and be ready", 30*time.Second, func() bool { code, _ := a.readyz(); return code == http.StatusOK })
			waitFor(t, "B ready as a standby of a live leader", 10*time.Second, func() bool { code, _ := b.readyz(); return code == http.StatusOK })
			if got := a.gauge(t, "cutover_coordinator_leader"); got != "1" {
				t.Errorf("leader's cutover_coordinator_leader = %s, want 1", got)
			}
			if got := b.gauge(t, "cutover_coordinator_leader"); got != "0" {
				t.Errorf("standby's cutover_coordinator_leader = %s, want 0", got)
			}
			// Ready for as long as A renews: twice its lease duration.
			for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
				if code, body := b.readyz(); code != http.StatusOK {
					t.Fatalf("B /readyz while A leads: %d %s", code, body)
				}
			}

			// A is cut off: it stops leading, and nobody takes the lock.
			a.net.cut.Store(true)
			select {
			case <-a.done:
			case <-time.After(20 * time.Second):
				t.Fatal("A did not stop after losing the apiserver")
			}
			var body string
			waitFor(t, "B unready once A's record stands still for a lease duration", 15*time.Second, func() bool {
				var code int
				code, body = b.readyz()
				return code == http.StatusServiceUnavailable
			})
			if !strings.Contains(body, want+": its holder la-"+lock+" has not renewed it for") {
				t.Errorf("B /readyz with a dead holder: %q, want it to name %s and la-%s", body, want, lock)
			}

			// B may write again: it takes the lock and is Ready as leader.
			b.net.readOnly.Store(false)
			waitFor(t, "B to lead and be ready", 30*time.Second, func() bool { code, _ := b.readyz(); return code == http.StatusOK })
			if got := b.gauge(t, "cutover_coordinator_leader"); got != "1" {
				t.Errorf("B leading: cutover_coordinator_leader = %s, want 1", got)
			}
		})
	}
}

// gauge reads an unlabelled sample from r's /metrics.
func (r *replica) gauge(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get(r.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return "(absent)"
}
