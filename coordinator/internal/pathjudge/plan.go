package pathjudge

import (
	"fmt"
	"slices"

	"github.com/cutover-dev/cutover/coordinator/internal/probemesh"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// smallFrame is the size of the frames that tell "blocked" and "VNI
// dropped" from an MTU problem: far below any underlay's MTU.
const smallFrame = 256

// Peers is whom each node exchanges frames with, both ways: every
// other node up to sampleAbove nodes, else the probe sample of k, which
// is symmetric (every node is sender and receiver of each of its pairs).
// The second result says which.
func Peers(nodes []string, sampleAbove, k int) (map[string][]string, string) {
	if len(nodes) <= sampleAbove {
		return probemesh.Sample(nodes, 0), "every pair"
	}
	return probemesh.Sample(nodes, k), fmt.Sprintf("sampled above %d nodes: every node exchanges frames both ways with at least %d others (a ring at spread distances, as the probe mesh)", sampleAbove, k)
}

// Sizes are the outer packet sizes sent: a small frame, steps below
// the full size to name the largest that passes, and the full size.
func Sizes(mtu uint32) []uint32 {
	full := mtu + pathprobe.Overhead
	out := []uint32{smallFrame}
	for _, d := range []uint32{400, 200, 100, 0} {
		if full > d && full-d > smallFrame {
			out = append(out, full-d)
		}
	}
	return slices.Compact(out)
}

// ReferenceVNI is a VNI the overlay does not use.
func ReferenceVNI(vnis []uint32) uint32 {
	for v := uint32(0xC07); ; v++ {
		if !slices.Contains(vnis, v) {
			return v
		}
	}
}

// RetryPeers is the second round's plan: for every direction that did not
// pass (not one whose node could not be checked), both its nodes send to
// each other again.
func RetryPeers(pairs []*coordinatorv1.PathPair) map[string][]string {
	out := map[string][]string{}
	add := func(a, b string) {
		if !slices.Contains(out[a], b) {
			out[a] = append(out[a], b)
		}
	}
	for _, p := range pairs {
		switch p.GetVerdict() {
		case "ok", "not_checked", "node_firewall":
			continue
		}
		add(p.GetFrom(), p.GetTo())
		add(p.GetTo(), p.GetFrom())
	}
	return out
}

// MergeSide folds a second round's answers into the first's: a frame
// counts as received or answered when it was in either round.
func MergeSide(dst, src Side) {
	for peer, frames := range src {
		if dst[peer] == nil {
			dst[peer] = map[Frame]*agentv1.PathProbeResult{}
		}
		for f, r := range frames {
			d := dst[peer][f]
			if d == nil {
				dst[peer][f] = r
				continue
			}
			d.Received = d.Received || r.Received
			d.Answered = d.Answered || r.Answered
			d.Wire = d.Wire || r.Wire
			if d.ControlError != "" && r.ControlError == "" {
				d.ControlError = ""
			}
			if r.SendError == "" {
				d.SendError = ""
			}
		}
	}
}

// FailedDirections counts the checked directions that did not pass.
func FailedDirections(pairs []*coordinatorv1.PathPair) int {
	n := 0
	for _, p := range pairs {
		switch p.GetVerdict() {
		case "ok", "not_checked", "node_firewall":
		default:
			n++
		}
	}
	return n
}
