// Package replica is the coordinator's cluster process (--kube): one
// replica of the coordinator Deployment. It always serves its endpoints;
// as a standby it forwards the API to the leader and is ready while a live
// one leads; when it wins the Lease it builds the coordinator over that
// leadership's kube.Session and runs it until the Lease is lost.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/coordinator/kube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Replica is one coordinator replica in a cluster: it always serves its
// endpoints; as a standby it forwards the API to the leader (found from
// the lock and the leader's pod) and is ready while a live one leads, and when it wins the Lease it builds the
// coordinator over that leadership's Session: the ConfigMap journal, the
// Session as the Hook (source of truth, cluster preflight), the discovered
// agents (discovered again before every plan: Session.Refresh), and the
// leadership's context, so every agent call stops the moment the Lease is
// lost.
type Replica struct {
	cfg   coordinator.Config
	kcfg  kube.Config
	rc    *rest.Config
	log   *slog.Logger
	extra []coordinator.Option // tests: how to dial the agents

	metrics *coordinator.Metrics
	srv     *coordinator.Server
	leases  kubernetes.Interface

	mu        sync.Mutex
	lockWatch *kube.LockWatch
	leader    string
	leaderErr error
	leaderAt  time.Time
}

// New builds a replica over the cluster rc reaches: it listens at once
// (cfg.Listen), as a standby until Run wins the Lease. extra are more
// options for the coordinator each leadership builds (tests: how to dial
// the agents).
func New(cfg coordinator.Config, kcfg kube.Config, rc *rest.Config, log *slog.Logger, extra ...coordinator.Option) (*Replica, error) {
	cfg.Cluster = true
	if cfg.JournalKeep > 0 { // one --journal-keep for files, ConfigMaps and memory
		kcfg.Journal.Keep = cfg.JournalKeep
	}
	if err := errors.Join(cfg.Validate(), kcfg.Validate()); err != nil {
		return nil, err
	}
	if cfg.Insecure {
		log.Warn("INSECURE MODE: no TLS to agents or from coordctl; anyone who can reach these ports can change the overlay. Use only in a local lab.")
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	m := coordinator.NewMetrics()
	srv, err := coordinator.Listen(cfg, m, log)
	if err != nil {
		return nil, err
	}
	p := &Replica{cfg: cfg, kcfg: kcfg, rc: rc, log: log, extra: extra, metrics: m, srv: srv, leases: cs,
		lockWatch: kube.NewLockWatch(cs, kcfg.Leader)}
	srv.SetStandby(kcfg.Leader.Identity, p.currentLeader)
	fwd, err := coordinator.ForwardDialOptions(cfg)
	if err != nil {
		srv.Stop()
		return nil, err
	}
	srv.SetForward(p.leaderAddr, fwd...)
	return p, nil
}

// Run serves until ctx ends (nil) or the Lease is lost (kube.ErrLeaseLost:
// exit, and start again as a standby).
func (p *Replica) Run(ctx context.Context) error {
	p.srv.Start()
	defer p.srv.Stop()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var serveErr error
	go func() {
		select {
		case serveErr = <-p.srv.Err():
			cancel()
		case <-runCtx.Done():
		}
	}()
	p.log.Info("coordinator serving (cluster mode)", "listen", p.cfg.Listen, "identity", p.kcfg.Leader.Identity,
		"lease", p.kcfg.Leader.Namespace+"/"+p.kcfg.Leader.Name, "cni", p.kcfg.CNI)
	err := kube.Run(runCtx, p.rc, p.kcfg, p.lead, p.log)
	cancel()
	return errors.Join(err, serveErr)
}

// lead runs one leadership: it returns when lctx ends.
func (p *Replica) lead(lctx context.Context, s *kube.Session) error {
	opts := append([]coordinator.Option{
		coordinator.WithLogger(p.log),
		coordinator.WithMetrics(p.metrics),
		coordinator.WithJournal(s.Journal),
		coordinator.WithHook(s),
		coordinator.WithInventorySource(s.Refresh), // nodes that join later are in the next plan
		coordinator.WithContext(lctx),
	}, p.extra...)
	c, err := coordinator.New(p.cfg, s.Inventory, opts...)
	if err != nil {
		return err
	}
	c.WarmAgents()
	p.log.Info("leading: serving the API", "agents", len(s.Inventory.Agents))
	p.srv.Lead(lctx, c)
	return nil
}

// leaderAddr is where the leader serves the API: its pod's IP (the
// node's, on the host network) on our own API port; every replica runs
// the same --listen.
func (p *Replica) leaderAddr(ctx context.Context, leader string) (string, error) {
	port, err := apiPort(p.cfg.Listen)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pod, err := p.leases.CoreV1().Pods(p.kcfg.Leader.Namespace).Get(ctx, leader, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %w", p.kcfg.Leader.Namespace, leader, err)
	}
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("pod %s/%s has no IP yet", p.kcfg.Leader.Namespace, leader)
	}
	return net.JoinHostPort(pod.Status.PodIP, port), nil
}

// apiPort is the port of the first TCP address in --listen that is not
// loopback (the pod IP's, where another replica can reach us).
func apiPort(listen string) (string, error) {
	var first string
	for _, a := range strings.Split(listen, ",") {
		h, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil {
			continue // unix:/path
		}
		if first == "" {
			first = port
		}
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			return port, nil
		}
	}
	if first == "" {
		return "", fmt.Errorf("--listen %q: no TCP address, so no port to reach the leader on", listen)
	}
	return first, nil
}

// currentLeader reads the lock for a standby's refusals and /readyz: the
// live holder, or why none leads. At most once a second (probes call it
// often); the lock watch judges liveness by how long the record has stood
// still, so a leader that died without releasing the lock stops counting
// one lease duration after its last renewal.
func (p *Replica) currentLeader() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.leaderAt) < time.Second {
		return p.leader, p.leaderErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p.leader, p.leaderErr = p.lockWatch.Leader(ctx)
	p.leaderAt = time.Now()
	return p.leader, p.leaderErr
}
