package pathjudge

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// Frame is one (VNI, size) of a path check.
type Frame struct {
	VNI     uint32
	Size    uint32
	Control bool // sent to the current port (pathMatrix.control)
}

// Side is what one node's agent answered, by peer and frame.
type Side map[string]map[Frame]*agentv1.PathProbeResult

func SideOf(resp *agentv1.PathCheckResponse) Side {
	s := Side{}
	for _, r := range resp.GetResults() {
		if s[r.Peer] == nil {
			s[r.Peer] = map[Frame]*agentv1.PathProbeResult{}
		}
		s[r.Peer][Frame{r.Vni, r.Size, r.Control}] = r
	}
	return s
}

// Matrix judges every checked direction from the two sides' answers.
// It does no I/O: the inputs are the plan (who exchanged frames with
// whom, which VNIs and sizes) and what each agent saw (sides; a node
// whose check failed is in failed with why).
type Matrix struct {
	Port      uint32
	VNIs      []uint32 // the overlay's
	Reference uint32   // not the overlay's: tells a VNI-specific drop
	Sizes     []uint32 // ascending; sizes[0] is the small frame, the last the full one
	Peers     map[string][]string
	Sides     map[string]Side
	Failed    map[string]string
	// Control is the current port the Control frames went to (0: none),
	// with the VNI they carried.
	Control    uint32
	ControlVNI uint32
	Lead       time.Duration // every round's start lead (pathLead)
}

// controlSeen reports whether to saw any of from's control frames on the
// current port; ran is false when to's capture could not run.
func (m *Matrix) controlSeen(from, to string) (seen, ran bool) {
	if m.Control == 0 {
		return false, false
	}
	for f, r := range m.Sides[to][from] {
		if !f.Control {
			continue
		}
		if r.ControlError != "" {
			return false, false
		}
		ran = true
		seen = seen || r.Received
	}
	return seen, ran
}

// controlPassed reports whether from's control frame of vni and size
// reached to on the current port; known is false when to has no such
// result (an agent from before the control mirrored the frames, or no
// capture ran): then nothing is known about the current port.
func (m *Matrix) controlPassed(from, to string, vni, size uint32) (passed, known bool) {
	if m.Control == 0 {
		return false, false
	}
	r := m.Sides[to][from][Frame{vni, size, true}]
	if r == nil || r.ControlError != "" {
		return false, false
	}
	return r.Received, true
}

// direction is what both sides answered about from → to: to's record of
// from's frames (received) and from's of to (answered).
type direction struct {
	atTo, atFrom map[Frame]*agentv1.PathProbeResult
}

// dir looks the two sides up once per direction: at 10,000 nodes judging
// looked them up per frame, three map reads each, 1.2 million reads.
func (m *Matrix) dir(from, to string) direction {
	return direction{atTo: m.Sides[to][from], atFrom: m.Sides[from][to]}
}

// passed reports whether frame f went from → to as far as the check's
// sockets: to received from's request, or from got to's answer (which
// needs both directions).
func (d direction) passed(f Frame) bool {
	if r := d.atTo[f]; r != nil && r.Received {
		return true
	}
	r := d.atFrom[f]
	return r != nil && r.Answered
}

// arrived reports whether frame f crossed the underlay from → to: it
// passed, or to's packet capture saw it arrive on its interfaces. The
// capture sees a frame before to's own firewall, as it sees the control
// frames on the current port: the two ports are judged on the same
// evidence, and a frame to's own firewall drops before Prepare
// opens the port is not taken for the underlay's.
func (d direction) arrived(f Frame) bool {
	if r := d.atTo[f]; r != nil && r.Wire {
		return true
	}
	return d.passed(f)
}

// sendErr is the local send error of from's frame f to to, if any.
func (d direction) sendErr(f Frame) string {
	if r := d.atFrom[f]; r != nil {
		return r.SendError
	}
	return ""
}

// Judgement is what judge found: a PathPair per direction; the problems
// that refuse the cutover; the warnings, problems the current port has
// as well (the new port is no worse: the cutover goes, flagged); and the
// notes (what the check saw that is no problem of the underlay's).
type Judgement struct {
	Pairs                     []*coordinatorv1.PathPair
	Problems, Warnings, Notes []string
}

// Judge returns one PathPair per direction of every pair, sorted, and the
// problems, warnings and notes, each naming the nodes.
func (m *Matrix) Judge() Judgement {
	// Both directions of every pair, once each: sorted, then compacted
	// (a slice, not a set: the set's inserts were an eighth of judging
	// 10,000 nodes).
	var keys [][2]string
	for from, ps := range m.Peers {
		for _, to := range ps {
			keys = append(keys, [2]string{from, to}, [2]string{to, from})
		}
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	keys = slices.Compact(keys)
	allVNIs := append(slices.Clone(m.VNIs), m.Reference)
	full := m.Sizes[len(m.Sizes)-1]
	small := m.Sizes[0]
	var j Judgement
	var blocked, vniDrops, mtu, inconclusive, vniShared, mtuShared []string
	firewalled := map[string][]string{} // by receiving node: directions its own firewall dropped
	ctlPassed := 0                      // blocked directions whose control passed
	for _, k := range keys {
		from, to := k[0], k[1]
		p := &coordinatorv1.PathPair{From: from, To: to}
		j.Pairs = append(j.Pairs, p)
		if why, ok := m.Failed[from]; ok {
			p.Verdict, p.Detail = "not_checked", from+": "+why
			continue
		}
		if why, ok := m.Failed[to]; ok {
			p.Verdict, p.Detail = "not_checked", to+": "+why
			continue
		}
		d := m.dir(from, to)
		// The underlay is judged on what arrived at to's interfaces; what
		// reached the check's socket tells to's own firewall apart.
		passedAny, socketAny := false, false
		for _, v := range allVNIs {
			for _, z := range m.Sizes {
				f := Frame{VNI: v, Size: z}
				if d.arrived(f) {
					passedAny = true
					p.LargestSize = max(p.LargestSize, z)
				}
				socketAny = socketAny || d.passed(f)
			}
		}
		fw := ""
		if passedAny && !socketAny {
			fw = fmt.Sprintf("; the frames reached %s (seen on its interfaces) but none reached the check's socket: %s's own firewall drops udp/%d (Prepare opens it)", to, to, m.Port)
			firewalled[to] = append(firewalled[to], from+"→"+to)
		}
		if !passedAny {
			seen, ran := m.controlSeen(from, to)
			if ran && !seen {
				p.Verdict = "inconclusive"
				p.Detail = fmt.Sprintf("nothing passed %s→%s on udp/%d, nor on the current port udp/%d: the pair's underlay or the check is down, this says nothing about udp/%d", from, to, m.Port, m.Control, m.Port)
				inconclusive = append(inconclusive, from+"→"+to)
				continue
			}
			p.Verdict = "blocked"
			p.Detail = fmt.Sprintf("no VXLAN frame passed %s→%s on udp/%d (no VNI, no size)", from, to, m.Port)
			if seen {
				p.Detail += fmt.Sprintf(" while the current port udp/%d passes", m.Control)
				ctlPassed++
			}
			blocked = append(blocked, from+"→"+to)
			continue
		}
		refOK := d.arrived(Frame{VNI: m.Reference, Size: small})
		for _, v := range m.VNIs {
			if refOK && !d.arrived(Frame{VNI: v, Size: small}) {
				p.DroppedVnis = append(p.DroppedVnis, v)
			}
		}
		if len(p.DroppedVnis) > 0 {
			p.Verdict = "vni"
			p.Detail = fmt.Sprintf("VXLAN frames with the overlay's VNI %s dropped %s→%s on udp/%d while VNI %d passes: a middlebox inspects VXLAN", joinU32(p.DroppedVnis), from, to, m.Port, m.Reference)
			item := fmt.Sprintf("%s→%s (VNI %s)", from, to, joinU32(p.DroppedVnis))
			if m.vniShared(from, to, p.DroppedVnis, small) {
				p.Detail += fmt.Sprintf("; the current port udp/%d drops them too: the overlay has this today", m.Control)
				vniShared = append(vniShared, item)
			} else {
				vniDrops = append(vniDrops, item)
			}
			p.Detail += fw
			continue
		}
		// The full size with any VNI that passes small frames.
		fullOK := false
		var local string
		for _, v := range allVNIs {
			if d.arrived(Frame{VNI: v, Size: small}) && d.arrived(Frame{VNI: v, Size: full}) {
				fullOK = true
			}
			if e := d.sendErr(Frame{VNI: v, Size: full}); e != "" {
				local = e
			}
		}
		if !fullOK {
			p.Verdict = "mtu"
			p.Detail = fmt.Sprintf("frames of %d bytes (overlay MTU + %d) with DF dropped %s→%s on udp/%d; the largest that passed: %d", full, full-m.mtu(), from, to, m.Port, p.LargestSize)
			if local != "" {
				p.Detail += "; sending failed on " + from + ": " + local
			}
			if ctl, ok := m.mtuShared(from, to, p.LargestSize); ok {
				p.Detail += fmt.Sprintf("; the current port udp/%d drops them too (largest passed %d): the overlay has this today", m.Control, ctl)
				mtuShared = append(mtuShared, fmt.Sprintf("%s→%s (largest passed %d, on the current port %d)", from, to, p.LargestSize, ctl))
			} else {
				mtu = append(mtu, fmt.Sprintf("%s→%s (largest passed %d)", from, to, p.LargestSize))
			}
			p.Detail += fw
			continue
		}
		if fw != "" {
			p.Verdict = "node_firewall"
			p.Detail = fmt.Sprintf("VXLAN frames cross %s→%s on udp/%d at full size", from, to, m.Port) + fw
			continue
		}
		p.Verdict = "ok"
	}
	if len(blocked) > 0 {
		ctl := ""
		if ctlPassed == len(blocked) {
			ctl = fmt.Sprintf(" (the current port udp/%d passes between them: the control)", m.Control)
		}
		j.Problems = append(j.Problems, fmt.Sprintf("underlay path check: udp/%d blocked between %d node pair(s), nothing passed: %s%s; open udp/%d between these nodes in the underlay (firewall, security group, NSX) or pick another port",
			m.Port, len(blocked), model.Abbreviate(blocked, 20), ctl, m.Port))
	}
	if len(vniDrops) > 0 {
		j.Problems = append(j.Problems, fmt.Sprintf("underlay path check: VXLAN frames with the overlay's VNI dropped on udp/%d while other VNIs pass (a middlebox inspecting VXLAN): %s",
			m.Port, model.Abbreviate(vniDrops, 20)))
	}
	if len(mtu) > 0 {
		j.Problems = append(j.Problems, fmt.Sprintf("underlay path check: full-size VXLAN frames (%d bytes, DF) dropped on udp/%d (MTU black hole): %s; raise the underlay MTU or lower the overlay MTU to fit",
			full, m.Port, model.Abbreviate(mtu, 20)))
	}
	if len(inconclusive) > 0 {
		j.Problems = append(j.Problems, fmt.Sprintf("underlay path check cannot conclude for %d node pair(s): nothing passed on udp/%d nor on the current port udp/%d (the control): %s; is the overlay itself up between them?",
			len(inconclusive), m.Port, m.Control, model.Abbreviate(inconclusive, 20)))
	}
	var nc []string
	for _, n := range slices.Sorted(maps.Keys(m.Failed)) {
		nc = append(nc, n+": "+m.Failed[n])
	}
	if len(nc) > 0 {
		j.Problems = append(j.Problems, "underlay path check not run on "+strings.Join(nc, "; "))
	}
	if len(vniShared) > 0 {
		j.Warnings = append(j.Warnings, fmt.Sprintf("underlay path check: VXLAN frames with the overlay's VNI dropped on udp/%d, and the current port udp/%d drops them too (the overlay has this today; the new port is no worse): %s",
			m.Port, m.Control, model.Abbreviate(vniShared, 20)))
	}
	if len(mtuShared) > 0 {
		j.Warnings = append(j.Warnings, fmt.Sprintf("underlay path check: full-size VXLAN frames (%d bytes, DF) dropped on udp/%d, and the current port udp/%d drops them too (an MTU problem the overlay has today; the new port is no worse): %s; raise the underlay MTU or lower the overlay MTU to fit",
			full, m.Port, m.Control, model.Abbreviate(mtuShared, 20)))
	}
	for _, n := range slices.Sorted(maps.Keys(firewalled)) {
		j.Notes = append(j.Notes, fmt.Sprintf("udp/%d reaches %s, but %s's own firewall drops it before the check's socket (the frames were seen arriving on its interfaces): %s; not the underlay: Prepare opens udp/%d in the firewall of every node before anything flips, and verify rolls back if a rule it does not open still drops it",
			m.Port, n, n, model.Abbreviate(firewalled[n], 20), m.Port))
	}
	return j
}

// vniShared reports whether the current port drops the overlay's VNIs
// vnis from → to as well, while it passes the reference VNI: the control
// mirrors those frames at the small size.
func (m *Matrix) vniShared(from, to string, vnis []uint32, small uint32) bool {
	if ref, ok := m.controlPassed(from, to, m.Reference, small); !ok || !ref {
		return false
	}
	for _, v := range vnis {
		if passed, ok := m.controlPassed(from, to, v, small); !ok || passed {
			return false
		}
	}
	return true
}

// mtuShared reports whether the current port drops the full-size frames
// from → to as well: its small control frame passed, its full one did not,
// and the largest that passed there (returned) is no larger than the
// largest that passed on the new port, so that the new port is no worse.
func (m *Matrix) mtuShared(from, to string, largest uint32) (uint32, bool) {
	var ctl uint32
	for _, z := range m.Sizes {
		passed, known := m.controlPassed(from, to, m.ControlVNI, z)
		if !known {
			return 0, false
		}
		if passed {
			ctl = z
		}
	}
	full := m.Sizes[len(m.Sizes)-1]
	return ctl, ctl > 0 && ctl < full && ctl <= largest
}

func (m *Matrix) mtu() uint32 {
	return m.Sizes[len(m.Sizes)-1] - pathprobe.Overhead
}

func joinU32(v []uint32) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
