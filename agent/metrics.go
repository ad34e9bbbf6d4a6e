package agent

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/version"
)

// Metrics are the agent's Prometheus metrics, registered in an injected
// registry (never the global one, so tests and several in-process agents
// do not collide). Metrics implements operation.Observer.
type Metrics struct {
	currentPort    prometheus.Gauge
	phase          *prometheus.GaugeVec
	applyDuration  prometheus.Histogram
	commitLateness prometheus.Histogram
	rpcRequests    *prometheus.CounterVec
	deadmanReverts prometheus.Counter
	tlsRejections  *prometheus.CounterVec
	tlsReloads     *prometheus.CounterVec
	buildInfo      *prometheus.GaugeVec
	pathChecks     *prometheus.CounterVec
	pathSilent     prometheus.Gauge
	standing       *prometheus.CounterVec
	portKept       *prometheus.CounterVec
}

var _ operation.Observer = (*Metrics)(nil)

// NewMetrics creates the metrics and registers them in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		currentPort: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_agent_current_port",
			Help: "VXLAN UDP port last read back from the dataplane.",
		}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cutover_agent_operation_phase",
			Help: "Phase of the current or last operation: 1 for the phase it is in, 0 for the others.",
		}, []string{"phase"}),
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cutover_agent_apply_duration_seconds",
			Help:    "Time from sending a commit to the dataplane to its confirmed read-back.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2.5, 12), // 100µs .. ~6s
		}),
		commitLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cutover_agent_commit_lateness_seconds",
			Help:    "How late a commit was sent after its requested instant, in the agent's clock.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 11), // 1µs .. ~1s
		}),
		rpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_rpc_requests_total",
			Help: "gRPC requests served, by method and status code.",
		}, []string{"method", "code"}),
		deadmanReverts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cutover_agent_deadman_reverts_total",
			Help: "Committed changes the agent reverted by itself because no confirm came by the dead-man deadline.",
		}),
		tlsRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_tls_rejections_total",
			Help: "gRPC clients refused during the TLS handshake, by reason.",
		}, []string{"reason"}),
		tlsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_tls_reloads_total",
			Help: "Certificate files (--tls-ca, --tls-cert, --tls-key) re-read after they changed on disk, by result: ok (in use from the next handshake) or error (refused, e.g. a key that does not match its certificate; the last good set stays in use).",
		}, []string{"result"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cutover_agent_build_info",
			Help: "Always 1; the version label is the agent's build.",
		}, []string{"version"}),
		pathChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_path_checks_total",
			Help: "Underlay path checks (PathCheck) run, by result: ok (ran; what passed is in the answer), port_in_use (the port could not be bound), error.",
		}, []string{"result"}),
		pathSilent: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cutover_agent_path_check_silent_peers",
			Help: "Peers of the last path check from which nothing came back or arrived, on any VNI or size: the pair looks blocked on the checked port.",
		}),
		standing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_standing_checks_total",
			Help: "Checks of what the backend keeps between operations (the OVS standing redirect flows, --ovs-standing-redirects), by result: in_place, written (put back: removed by something else, stale, or in another interface's way; each is a flow table change), error.",
		}, []string{"result"}),
		portKept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cutover_agent_port_keep_checks_total",
			Help: "Checks that the overlay's current port is open in the node firewall (at start, then every minute), by result: found (its rule was there), opened (the agent added its marked rule), error.",
		}, []string{"result"}),
	}
	reg.MustRegister(m.currentPort, m.phase, m.applyDuration, m.commitLateness, m.rpcRequests,
		m.deadmanReverts, m.tlsRejections, m.tlsReloads, m.buildInfo, m.pathChecks, m.pathSilent, m.standing, m.portKept)
	for _, r := range []string{"ok", "port_in_use", "error"} {
		m.pathChecks.WithLabelValues(r)
	}
	m.tlsReloads.WithLabelValues("ok")
	m.tlsReloads.WithLabelValues("error")
	m.buildInfo.WithLabelValues(version.Version).Set(1)
	m.PhaseChanged(operation.PhaseIdle)
	return m
}

// PhaseChanged implements operation.Observer.
func (m *Metrics) PhaseChanged(p operation.Phase) {
	for _, q := range operation.Phases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.phase.WithLabelValues(strings.ToLower(string(q))).Set(v)
	}
}

// Applied implements operation.Observer.
func (m *Metrics) Applied(apply, lateness time.Duration) {
	m.applyDuration.Observe(apply.Seconds())
	m.commitLateness.Observe(lateness.Seconds())
}

// DeadmanReverted implements operation.Observer.
func (m *Metrics) DeadmanReverted() { m.deadmanReverts.Inc() }

// PortObserved implements operation.Observer.
func (m *Metrics) PortObserved(port tunnelport.Port) { m.currentPort.Set(float64(port)) }

// TLSReloaded counts a reload of the certificate files: err nil when the
// new set is in use, else why it was refused.
func (m *Metrics) TLSReloaded(err error) {
	if err != nil {
		m.tlsReloads.WithLabelValues("error").Inc()
		return
	}
	m.tlsReloads.WithLabelValues("ok").Inc()
}

// PathChecked counts a path check by result; silent is the number of
// peers nothing passed with (result ok only).
func (m *Metrics) PathChecked(result string, silent int) {
	m.pathChecks.WithLabelValues(result).Inc()
	if result == "ok" {
		m.pathSilent.Set(float64(silent))
	}
}

// StandingChecked counts a dataplane.Keeper check: changed when it had to
// write.
func (m *Metrics) StandingChecked(changed bool, err error) {
	switch {
	case err != nil:
		m.standing.WithLabelValues("error").Inc()
	case changed:
		m.standing.WithLabelValues("written").Inc()
	default:
		m.standing.WithLabelValues("in_place").Inc()
	}
}

// PortKept counts a check of the overlay port's firewall opening.
func (m *Metrics) PortKept(opened bool, err error) {
	switch {
	case err != nil:
		m.portKept.WithLabelValues("error").Inc()
	case opened:
		m.portKept.WithLabelValues("opened").Inc()
	default:
		m.portKept.WithLabelValues("found").Inc()
	}
}

// TLSRejected counts a refused handshake; its signature fits the pki hook.
func (m *Metrics) TLSRejected(reason string) { m.tlsRejections.WithLabelValues(reason).Inc() }

// UnaryInterceptor counts every unary RPC by method (the last path element,
// e.g. "Prepare") and status code.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
		m.rpcRequests.WithLabelValues(method, status.Code(err).String()).Inc()
		return resp, err
	}
}
