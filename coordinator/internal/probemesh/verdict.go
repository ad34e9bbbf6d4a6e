package probemesh

import (
	"fmt"
	"strings"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// verifySlack is added to the offsets' own error bound (half the RTT of
// each measurement) before a probe counts as sent after the flip.
const verifySlack = time.Millisecond

// Flip is what the pass rule knows about one node.
type Flip struct {
	// Flipped is when the node's change took effect, coordinator clock
	// (Unix ns): its applied instant plus how long the dataplane took to
	// confirm it. 0: the node did not flip (outside the targets).
	Flipped int64
	// Offset is the node's clock minus the coordinator's; RTT the round
	// trip of the Clock sample it came from (0: unknown, e.g. resumed).
	Offset, RTT time.Duration
}

// Verdict is the judgement of one sampled pair.
type Verdict int

const (
	Pass     Verdict = iota // answered a probe sent after both flipped
	Dark                    // answered nothing sent after the flip: the cutover's fault
	Baseline                // never answered, though probed well before the change: dark already
	Missing                 // the sender does not probe the peer (or did not answer ProbeStats)
)

// PassAfter is T_A, the instant (A's clock) after which a probe A sent
// and got answered proves the pair works on the new port: the later of
// the two flips, in A's clock, plus the offsets' error (half of each
// measurement's RTT, both conversions) and verifySlack.
func PassAfter(a, b Flip) int64 {
	flip := max(a.Flipped, b.Flipped)
	margin := (a.RTT+b.RTT)/2 + verifySlack
	if a.RTT == 0 || b.RTT == 0 {
		// An offset from a journal (resumed run) has no RTT kept: assume
		// a slow measurement.
		margin += 5 * time.Millisecond
	}
	return flip + (a.Offset + margin).Nanoseconds()
}

// JudgePair applies the pass rule to A's figures st for peer B. timeout is
// A's probe timeout: a pair counts as dark before the change (baseline)
// only when A had probed it for at least that long before the flip and
// never got an answer; a pair added too late to tell is blamed.
func JudgePair(st *agentv1.PeerProbeStats, a, b Flip, timeout time.Duration) Verdict {
	if st == nil {
		return Missing
	}
	t := PassAfter(a, b)
	if st.GetLastAnsweredSentUnixNano() > t {
		return Pass
	}
	flipA := max(a.Flipped, b.Flipped) + a.Offset.Nanoseconds()
	if st.GetLastAnswerUnixNano() == 0 && st.GetProbingSinceUnixNano() != 0 &&
		st.GetProbingSinceUnixNano()+timeout.Nanoseconds() <= flipA {
		return Baseline
	}
	return Dark
}

// Result is a verification's outcome by pair.
type Result struct {
	Dark, Missing, Baseline []Pair
	Why                     map[Pair]string
}

func (m Result) Failed() bool { return len(m.Dark) > 0 || len(m.Missing) > 0 }

// Err names the failing pairs, the way the report shows them.
func (m Result) Err() error {
	if !m.Failed() {
		return nil
	}
	var parts []string
	for _, p := range m.Dark {
		parts = append(parts, p.String()+" "+m.Why[p])
	}
	for _, p := range m.Missing {
		parts = append(parts, p.String()+" "+m.Why[p])
	}
	return fmt.Errorf("probe mesh: %d of the sampled pairs carry no traffic on the new port: %s", len(m.Dark)+len(m.Missing), strings.Join(parts, "; "))
}

// Outcome sorts the pairs by their last verdict, in the sample's
// order.
func Outcome(pairs []Pair, verdict map[Pair]Verdict, why map[Pair]string) Result {
	res := Result{Why: why}
	for _, p := range pairs {
		switch verdict[p] {
		case Dark:
			res.Dark = append(res.Dark, p)
		case Missing:
			res.Missing = append(res.Missing, p)
		case Baseline:
			res.Baseline = append(res.Baseline, p)
		}
	}
	return res
}

// DarkWhy says how long ago, relative to the flip, the pair last worked.
func DarkWhy(st *agentv1.PeerProbeStats, a, b Flip) string {
	if st.GetLastAnsweredSentUnixNano() == 0 {
		return "never answered"
	}
	before := time.Duration(PassAfter(a, b) - st.GetLastAnsweredSentUnixNano())
	return fmt.Sprintf("no answer since the commit (last answered probe sent %s before the flip)", before.Round(time.Microsecond))
}
