package coordinator

import (
	"log/slog"
	"sync"

	"github.com/cutover-dev/cutover/pkg/pki"
	"github.com/prometheus/client_golang/prometheus"
)

// phases is every value the phase label takes.
var phases = []string{"idle", "preflight", "prepare", "commit", "verify", "confirm", "finalize", "abort", "unswitch", "rollback"}

// Metrics are the coordinator's Prometheus metrics, in their own registry.
type Metrics struct {
	Registry      *prometheus.Registry
	phase         *prometheus.GaugeVec
	phaseDuration *prometheus.HistogramVec
	commitSpread  prometheus.Gauge
	effectSpread  prometheus.Gauge
	commitMargin  prometheus.Gauge
	agentsReady   prometheus.Gauge
	operations    *prometheus.CounterVec
	tlsRejected   *prometheus.CounterVec // coordctl clients refused by the API server
	agentTLSRej   *prometheus.CounterVec // agents whose server certificate we refused
	lateCommits   prometheus.Counter
	tlsReloads    *prometheus.CounterVec
	pathChecks    *prometheus.CounterVec
	pathBlocked   prometheus.Gauge
	leader        prometheus.Gauge

	mu        sync.Mutex
	reloaders map[pki.Files]*pki.Reloader // one per identity: API server and agent client share it
}

// NewMetrics registers the metrics in a fresh registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cutover_coordinator_operation_phase",
			Help: "1 for the phase the current operation is in (idle when none), 0 for the others.",
		}, []string{"phase"}),
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cutover_coordinator_phase_duration_seconds",
			Help:    "Duration of each phase of an operation, from the first send to the last answer.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"phase"}),
		commitSpread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_commit_spread_seconds",
			Help: "Spread (max - min) of the instants the agents applied the last commit, in the coordinator's clock.",
		}),
		effectSpread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_effect_spread_seconds",
			Help: "Spread (max - min) of the instants the last commit took effect in the agents' dataplanes (OVS confirmed, kernel window closed), in the coordinator's clock.",
		}),
		commitMargin: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_commit_margin_seconds",
			Help: "The last commit instant minus the latest arrival of its Commit call at an agent, in the coordinator's clock: how early the fan-out was done (negative: late).",
		}),
		agentsReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_agents_ready",
			Help: "Agents that answered Info ready at the last look.",
		}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_coordinator_operations_total",
			Help: "Operations ended, by outcome.",
		}, []string{"outcome"}),
	}
	m.tlsRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_tls_rejections_total",
		Help: "API clients (coordctl) refused during the TLS handshake, by reason.",
	}, []string{"reason"})
	m.agentTLSRej = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_agent_tls_rejections_total",
		Help: "Connections to agents refused because of the agent's certificate, by reason.",
	}, []string{"reason"})
	m.lateCommits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cutover_coordinator_late_commits_total",
		Help: "Nodes that had not applied a commit by the commit instant plus the lateness budget (--commit-late-budget).",
	})
	m.tlsReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_tls_reloads_total",
		Help: "Certificate files (--tls-ca, --tls-cert, --tls-key) re-read after they changed on disk, by result: ok (in use from the next handshake) or error (refused, e.g. a key that does not match its certificate; the last good set stays in use).",
	}, []string{"result"})
	m.pathChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_path_checks_total",
		Help: "Underlay path checks run (every preflight, and coordctl pathcheck), by result: passed, problems (blocked pairs, VNI drops, MTU, nodes not checked).",
	}, []string{"result"})
	m.pathBlocked = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cutover_coordinator_path_check_blocked_pairs",
		Help: "Directed node pairs the last underlay path check found blocked on the checked port (nothing passed).",
	})
	// Per replica, so that "no replica leads" is max(...) == 0 over the
	// scraped replicas (the CutoverNoCoordinatorLeader alert).
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cutover_coordinator_leader",
		Help: "1 while this coordinator leads (serves the API itself and commands the agents), 0 while it is a standby.",
	})
	m.tlsReloads.WithLabelValues("ok")
	m.tlsReloads.WithLabelValues("error")
	m.pathChecks.WithLabelValues("passed")
	m.pathChecks.WithLabelValues("problems")
	m.Registry.MustRegister(m.lateCommits, m.tlsReloads, m.pathChecks, m.pathBlocked, m.leader)
	m.Registry.MustRegister(m.phase, m.phaseDuration, m.commitSpread, m.effectSpread, m.commitMargin, m.agentsReady, m.operations, m.tlsRejected, m.agentTLSRej)
	for _, o := range []string{"succeeded", "aborted", "rolled-back", "failed", "held"} {
		m.operations.WithLabelValues(o)
	}
	m.setPhase("idle")
	return m
}

// tlsReloader returns the one Reloader of f in this process, counting
// and logging its reloads.
func (m *Metrics) tlsReloader(f pki.Files, log *slog.Logger) (*pki.Reloader, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.reloaders[f]; ok {
		return r, nil
	}
	r, err := pki.NewReloader(f, pki.ReloadOptions{
		OnReload: func() {
			m.tlsReloads.WithLabelValues("ok").Inc()
			log.Info("TLS certificates reloaded from disk", "cert", f.Cert, "ca", f.CA)
		},
		OnError: func(err error) {
			m.tlsReloads.WithLabelValues("error").Inc()
			log.Error("TLS certificates changed on disk but cannot be used", "err", err)
		},
	})
	if err != nil {
		return nil, err
	}
	if m.reloaders == nil {
		m.reloaders = map[pki.Files]*pki.Reloader{}
	}
	m.reloaders[f] = r
	return r, nil
}

func (m *Metrics) apiTLSRejected(reason string)   { m.tlsRejected.WithLabelValues(reason).Inc() }
func (m *Metrics) agentTLSRejected(reason string) { m.agentTLSRej.WithLabelValues(reason).Inc() }

func (m *Metrics) setPhase(p string) {
	for _, q := range phases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.phase.WithLabelValues(q).Set(v)
	}
}
