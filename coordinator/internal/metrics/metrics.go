package metrics

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
	Phase         *prometheus.GaugeVec
	PhaseDuration *prometheus.HistogramVec
	CommitSpread  prometheus.Gauge
	EffectSpread  prometheus.Gauge
	CommitMargin  prometheus.Gauge
	AgentsReady   prometheus.Gauge
	Operations    *prometheus.CounterVec
	TLSRejected   *prometheus.CounterVec // coordctl clients refused by the API server
	AgentTLSRej   *prometheus.CounterVec // agents whose server certificate we refused
	LateCommits   prometheus.Counter
	TLSReloads    *prometheus.CounterVec
	PathChecks    *prometheus.CounterVec
	PathBlocked   prometheus.Gauge
	Leader        prometheus.Gauge

	mu        sync.Mutex
	reloaders map[pki.Files]*pki.Reloader // one per identity: API server and agent client share it
}

// New registers the metrics in a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cutover_coordinator_operation_phase",
			Help: "1 for the phase the current operation is in (idle when none), 0 for the others.",
		}, []string{"phase"}),
		PhaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cutover_coordinator_phase_duration_seconds",
			Help:    "Duration of each phase of an operation, from the first send to the last answer.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"phase"}),
		CommitSpread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_commit_spread_seconds",
			Help: "Spread (max - min) of the instants the agents applied the last commit, in the coordinator's clock.",
		}),
		EffectSpread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_effect_spread_seconds",
			Help: "Spread (max - min) of the instants the last commit took effect in the agents' dataplanes (OVS confirmed, kernel window closed), in the coordinator's clock.",
		}),
		CommitMargin: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_commit_margin_seconds",
			Help: "The last commit instant minus the latest arrival of its Commit call at an agent, in the coordinator's clock: how early the fan-out was done (negative: late).",
		}),
		AgentsReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_coordinator_agents_ready",
			Help: "Agents that answered Info ready at the last look.",
		}),
		Operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_coordinator_operations_total",
			Help: "Operations ended, by outcome.",
		}, []string{"outcome"}),
	}
	m.TLSRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_tls_rejections_total",
		Help: "API clients (coordctl) refused during the TLS handshake, by reason.",
	}, []string{"reason"})
	m.AgentTLSRej = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_agent_tls_rejections_total",
		Help: "Connections to agents refused because of the agent's certificate, by reason.",
	}, []string{"reason"})
	m.LateCommits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cutover_coordinator_late_commits_total",
		Help: "Nodes that had not applied a commit by the commit instant plus the lateness budget (--commit-late-budget).",
	})
	m.TLSReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_tls_reloads_total",
		Help: "Certificate files (--tls-ca, --tls-cert, --tls-key) re-read after they changed on disk, by result: ok (in use from the next handshake) or error (refused, e.g. a key that does not match its certificate; the last good set stays in use).",
	}, []string{"result"})
	m.PathChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cutover_coordinator_path_checks_total",
		Help: "Underlay path checks run (every preflight, and coordctl pathcheck), by result: passed, problems (blocked pairs, VNI drops, MTU, nodes not checked).",
	}, []string{"result"})
	m.PathBlocked = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cutover_coordinator_path_check_blocked_pairs",
		Help: "Directed node pairs the last underlay path check found blocked on the checked port (nothing passed).",
	})
	// Per replica, so that "no replica leads" is max(...) == 0 over the
	// scraped replicas (the CutoverNoCoordinatorLeader alert).
	m.Leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cutover_coordinator_leader",
		Help: "1 while this coordinator leads (serves the API itself and commands the agents), 0 while it is a standby.",
	})
	m.TLSReloads.WithLabelValues("ok")
	m.TLSReloads.WithLabelValues("error")
	m.PathChecks.WithLabelValues("passed")
	m.PathChecks.WithLabelValues("problems")
	m.Registry.MustRegister(m.LateCommits, m.TLSReloads, m.PathChecks, m.PathBlocked, m.Leader)
	m.Registry.MustRegister(m.Phase, m.PhaseDuration, m.CommitSpread, m.EffectSpread, m.CommitMargin, m.AgentsReady, m.Operations, m.TLSRejected, m.AgentTLSRej)
	for _, o := range []string{"succeeded", "aborted", "rolled-back", "failed", "held"} {
		m.Operations.WithLabelValues(o)
	}
	m.SetPhase("idle")
	return m
}

// TLSReloader returns the one Reloader of f in this process, counting
// and logging its reloads.
func (m *Metrics) TLSReloader(f pki.Files, log *slog.Logger) (*pki.Reloader, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.reloaders[f]; ok {
		return r, nil
	}
	r, err := pki.NewReloader(f, pki.ReloadOptions{
		OnReload: func() {
			m.TLSReloads.WithLabelValues("ok").Inc()
			log.Info("TLS certificates reloaded from disk", "cert", f.Cert, "ca", f.CA)
		},
		OnError: func(err error) {
			m.TLSReloads.WithLabelValues("error").Inc()
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

func (m *Metrics) APITLSRejected(reason string)   { m.TLSRejected.WithLabelValues(reason).Inc() }
func (m *Metrics) AgentTLSRejected(reason string) { m.AgentTLSRej.WithLabelValues(reason).Inc() }

func (m *Metrics) SetPhase(p string) {
	for _, q := range phases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.Phase.WithLabelValues(q).Set(v)
	}
}
