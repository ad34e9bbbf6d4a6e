package agent

import (
	"net/netip"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/agent/probe"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// The probe mesh's side of the AgentService: Info's probe address, the
// peers Prepare hands over.

// probeStatus is Info's probe_address and probe_off_reason.
func (s *Service) probeStatus() (addr, offReason string) {
	a, why := s.probes.status()
	if a.IsValid() {
		return a.String(), ""
	}
	return "", why
}

// checkProbePeers parses Prepare's probe_peers. Errors name the entry and
// are INVALID_ARGUMENT: a bad peer list fails the Prepare before anything
// changes (I6).
func (s *Service) checkProbePeers(in []*agentv1.ProbePeer) ([]probe.Peer, error) {
	if len(in) == 0 {
		return nil, nil
	}
	peers := make([]probe.Peer, 0, len(in))
	for i, p := range in {
		ap, err := netip.ParseAddrPort(p.GetAddress())
		switch {
		case p.GetName() == s.cfg.NodeName:
			return nil, status.Errorf(codes.InvalidArgument, "probe_peers[%d].name %q: this node itself: a node does not probe itself", i, p.GetName())
		case err != nil:
			return nil, status.Errorf(codes.InvalidArgument, "probe_peers[%d].address %q (peer %q): want ip:port, the peer's Info.probe_address", i, p.GetAddress(), p.GetName())
		}
		peers = append(peers, probe.Peer{Name: p.GetName(), Addr: ap})
	}
	if err := probe.CheckPeers(peers); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "probe_peers: %v", err)
	}
	return peers, nil
}

// setProbePeers makes peers the mesh's peer set after a Prepare succeeded
// (none: leave it). The coordinator's sample wins over --probe-peers for the
// operation and --probe-linger after it (probelinger.go), or until the next
// Prepare with peers. With probing
// off (--probe=false) the peers are ignored: Info says probing is off, and
// the coordinator sees no figures.
func (s *Service) setProbePeers(opID string, peers []probe.Peer) error {
	if len(peers) == 0 || s.probes == nil {
		return nil
	}
	// checkProbePeers ran CheckPeers already: this cannot fail, but a
	// prepared node whose peers are not the coordinator's must not answer
	// prepared either.
	if err := s.probes.mesh.SetPeers(peers); err != nil {
		return status.Errorf(codes.Internal, "operation %s: probe_peers: %v", opID, err)
	}
	s.probes.coordPeers.Store(true) // until they linger out (probelinger.go)
	return nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
