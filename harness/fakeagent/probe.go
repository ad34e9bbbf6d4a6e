package fakeagent

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/protobuf/proto"
)

// The fake's probe mesh: by default every peer the coordinator hands over
// with Prepare answers every probe (a healthy overlay); SetProbeDark makes
// peers stop answering at the commit, SetProbeNever makes them never have
// answered. Times are the agent's (skewed) clock, as the real agent's.

const (
	fakeProbeInterval = 10 * time.Millisecond
	fakeProbeTimeout  = 200 * time.Millisecond
)

// defaultProbeAddr is a probe address for node in the benchmarking range
// (never dialled: the fake only reports it).
func defaultProbeAddr(node string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	v := h.Sum32()
	return fmt.Sprintf("198.19.%d.%d:4800", (v>>8)%256, 1+v%254)
}

// SetProbeAddress sets the probe address Info and ProbeStats report; empty
// turns probing off, with why as probe_off_reason.
func (a *Agent) SetProbeAddress(addr, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probeAddr, a.probeOff = addr, why
}

// SetProbeDark makes the probes to peers go unanswered from the commit on
// (the overlay between this node and them broke with the change).
func (a *Agent) SetProbeDark(peers ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range peers {
		a.dark[p] = true
	}
}

// SetProbeNever makes peers never have answered, from long before the
// operation (a pair dark before the change).
func (a *Agent) SetProbeNever(peers ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range peers {
		a.never[p] = true
	}
}

// ProbePeers returns the peers the last Prepare handed over ("name=addr").
func (a *Agent) ProbePeers() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, p := range a.probePeers {
		out = append(out, p.Name+"="+p.Address)
	}
	return out
}

func (a *Agent) probeOffLocked() string {
	if a.probeAddr != "" {
		return ""
	}
	if a.probeOff == "" {
		return "probing disabled (--probe=false)"
	}
	return a.probeOff
}

// setProbePeersLocked replaces the peer set as the agent's Prepare does; a
// peer kept under the same address keeps its probing-since time.
func (a *Agent) setProbePeersLocked(peers []*agentv1.ProbePeer) {
	if len(peers) == 0 {
		return
	}
	now := a.now().UnixNano()
	since := map[string]int64{}
	for _, p := range peers {
		since[p.Name] = now
		for _, old := range a.probePeers {
			if old.Name == p.Name && old.Address == p.Address {
				since[p.Name] = a.probeSince[p.Name]
			}
		}
	}
	a.probePeers, a.probeSince = slices.Clone(peers), since
}

// ProbeStats implements AgentService: the figures SetPeers programmed,
// merged over the peers of the last Prepare; times not programmed follow
// the healthy mesh, or the dark and never-answered peers.
func (a *Agent) ProbeStats(_ context.Context, r *agentv1.ProbeStatsRequest) (*agentv1.ProbeStatsResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probeCalls++
	if r.Reset_ {
		a.probeResetCalls++
	}
	return a.probeStatsLocked(r.Reset_), nil
}

// ProbeStatsCalls counts ProbeStats calls, resets included; figures read
// by Info (probe_stats) are not among them.
func (a *Agent) ProbeStatsCalls() int { a.mu.Lock(); defer a.mu.Unlock(); return a.probeCalls }

// ProbeStatsResetCalls counts the ProbeStats calls that reset the
// counters (not the resets a Prepare carried).
func (a *Agent) ProbeStatsResetCalls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.probeResetCalls
}

// ProbeResets counts the probe counters' resets: by ProbeStats, or by a
// Prepare that carried reset_probe_stats.
func (a *Agent) ProbeResets() int { a.mu.Lock(); defer a.mu.Unlock(); return a.probeRst }

// probeStatsLocked is ProbeStats's answer (Info's too, when asked); a
// read counts in ProbeReads either way.
func (a *Agent) probeStatsLocked(reset bool) *agentv1.ProbeStatsResponse {
	if reset {
		a.probeRst++
	} else {
		a.probeReads++
	}
	resp := &agentv1.ProbeStatsResponse{Node: a.node, IntervalMicros: fakeProbeInterval.Microseconds(), Address: a.probeAddr,
		NowUnixNano: a.now().UnixNano(), TimeoutMicros: fakeProbeTimeout.Microseconds(), OffReason: a.probeOffLocked(),
		MaxStallMicros: a.stall.Microseconds()}
	if a.probeAddr == "" {
		return resp
	}
	var peers []*agentv1.PeerProbeStats
	for _, p := range a.peers {
		peers = append(peers, proto.Clone(p).(*agentv1.PeerProbeStats))
	}
	for _, p := range a.probePeers {
		if !slices.ContainsFunc(peers, func(s *agentv1.PeerProbeStats) bool { return s.Peer == p.Name }) {
			peers = append(peers, &agentv1.PeerProbeStats{Peer: p.Name, Address: p.Address})
		}
	}
	now := a.now().UnixNano()
	var flipped int64
	if a.op != nil && a.op.AppliedUnixNano != 0 && a.op.Phase != agentv1.Phase_PHASE_REVERTED {
		flipped = a.op.AppliedUnixNano
	}
	for _, p := range peers {
		if p.ProbingSinceUnixNano == 0 {
			p.ProbingSinceUnixNano = a.probeSince[p.Peer]
			if p.ProbingSinceUnixNano == 0 || a.never[p.Peer] {
				p.ProbingSinceUnixNano = now - int64(time.Hour)
			}
		}
		if p.LastAnswerUnixNano != 0 || p.LastAnsweredSentUnixNano != 0 || a.never[p.Peer] {
			continue
		}
		sent := now - int64(fakeProbeInterval)
		if a.dark[p.Peer] && flipped != 0 {
			sent = min(sent, flipped-int64(5*time.Millisecond))
		}
		p.LastAnsweredSentUnixNano, p.LastAnswerUnixNano = sent, sent+int64(time.Millisecond)
	}
	resp.Peers = peers
	return resp
}
