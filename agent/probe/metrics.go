package probe

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	sentDesc = prometheus.NewDesc("cutover_agent_probe_sent_total",
		"Overlay probes sent to a peer whose fate is known (answered or timed out).", []string{"peer"}, nil)
	lostDesc = prometheus.NewDesc("cutover_agent_probe_lost_total",
		"Overlay probes to a peer that were not answered within the timeout.", []string{"peer"}, nil)
	gapDesc = prometheus.NewDesc("cutover_agent_probe_longest_gap_seconds",
		"Longest time between two answers from a peer since the counters were last reset.", []string{"peer"}, nil)
	answersDesc = prometheus.NewDesc("cutover_agent_probe_answers_total",
		"Probes of other agents this agent answered, by how: riding in its own probe to the asker (one datagram for both), or alone.", []string{"how"}, nil)
)

// Collector exposes the mesh's figures at scrape time. Counters are totals
// since start and never go back on a Stats reset.
func (m *Mesh) Collector() prometheus.Collector { return collector{m} }

type collector struct{ m *Mesh }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sentDesc
	ch <- lostDesc
	ch <- gapDesc
	ch <- answersDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	now := m.now()
	type row struct {
		peer       string
		sent, lost uint64
		gapSeconds float64
	}
	rows := make([]row, 0, len(m.order))
	for _, ps := range m.order {
		m.settleLocked(ps, now)
		rows = append(rows, row{ps.peer.Name, ps.totalReceived + ps.totalLost, ps.totalLost, ps.longest.Seconds()})
	}
	answered, rode := m.answered, m.rode
	m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(answersDesc, prometheus.CounterValue, float64(rode), "riding")
	ch <- prometheus.MustNewConstMetric(answersDesc, prometheus.CounterValue, float64(answered-rode), "alone")
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(sentDesc, prometheus.CounterValue, float64(r.sent), r.peer)
		ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(r.lost), r.peer)
		ch <- prometheus.MustNewConstMetric(gapDesc, prometheus.GaugeValue, r.gapSeconds, r.peer)
	}
}
