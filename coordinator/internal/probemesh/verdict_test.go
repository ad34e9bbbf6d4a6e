package probemesh

import (
	"testing"
	"time"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// The pass rule: a pair A→B passes when A got an answer to a probe it sent
// after the later flip of the two, converted into A's clock, plus the
// offsets' error. Times in ms of the coordinator's clock, offsets and RTTs
// in ms.
func TestJudgePair(t *testing.T) {
	const ms = int64(time.Millisecond)
	base := int64(1_700_000_000_000) * ms
	at := func(v float64) int64 { return base + int64(v*float64(ms)) }
	timeout := 200 * time.Millisecond
	for _, tc := range []struct {
		name         string
		a, b         Flip
		since        int64 // A's clock
		answer, sent int64 // A's clock, 0 never
		want         Verdict
	}{
		{name: "answered after both flips", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{Flipped: at(0.5), RTT: time.Millisecond},
			since: at(-1000), answer: at(15), sent: at(10), want: Pass},
		{name: "sent between the flips: B had not flipped", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{Flipped: at(5), RTT: time.Millisecond},
			since: at(-1000), answer: at(6), sent: at(4), want: Dark},
		{name: "sent inside the offsets' error", a: Flip{Flipped: at(0), RTT: 2 * time.Millisecond}, b: Flip{Flipped: at(0), RTT: 2 * time.Millisecond},
			since: at(-1000), answer: at(3), sent: at(2.5), want: Dark}, // margin 2 ms + 1 ms slack
		{name: "just past the margin", a: Flip{Flipped: at(0), RTT: 2 * time.Millisecond}, b: Flip{Flipped: at(0), RTT: 2 * time.Millisecond},
			since: at(-1000), answer: at(4), sent: at(3.1), want: Pass},
		{name: "A's clock ahead: its stamps are later", a: Flip{Flipped: at(0), Offset: 250 * time.Millisecond, RTT: time.Millisecond}, b: Flip{Flipped: at(0), Offset: -400 * time.Millisecond, RTT: time.Millisecond},
			since: at(-1000), answer: at(100), sent: at(100), want: Dark}, // 100 ms in A's clock is 150 ms before the flip
		{name: "A's clock ahead, answered after", a: Flip{Flipped: at(0), Offset: 250 * time.Millisecond, RTT: time.Millisecond}, b: Flip{Flipped: at(0), Offset: -400 * time.Millisecond, RTT: time.Millisecond},
			since: at(-1000), answer: at(262), sent: at(260), want: Pass},
		{name: "B's flip counts in A's clock", a: Flip{Flipped: at(0), Offset: -50 * time.Millisecond, RTT: time.Millisecond}, b: Flip{Flipped: at(20), RTT: time.Millisecond},
			since: at(-1000), answer: at(-29), sent: at(-29.5), want: Dark}, // B flipped at 20 = -30 in A's clock, +2 ms margin
		{name: "B outside the targets (never flips)", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{RTT: time.Millisecond},
			since: at(-1000), answer: at(12), sent: at(10), want: Pass},
		{name: "resumed: no RTT kept, a wider margin", a: Flip{Flipped: at(0)}, b: Flip{Flipped: at(0)},
			since: at(-1000), answer: at(5), sent: at(4), want: Dark},
		{name: "never answered, probed long before: baseline", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{Flipped: at(0), RTT: time.Millisecond},
			since: at(-1000), want: Baseline},
		{name: "never answered, probed only since just before: blamed", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{Flipped: at(0), RTT: time.Millisecond},
			since: at(-100), want: Dark},
		{name: "answered before, dark since: blamed", a: Flip{Flipped: at(0), RTT: time.Millisecond}, b: Flip{Flipped: at(0), RTT: time.Millisecond},
			since: at(-1000), answer: at(-5), sent: at(-6), want: Dark},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &agentv1.PeerProbeStats{Peer: "b", ProbingSinceUnixNano: tc.since, LastAnswerUnixNano: tc.answer, LastAnsweredSentUnixNano: tc.sent}
			if got := JudgePair(st, tc.a, tc.b, timeout); got != tc.want {
				t.Errorf("verdict %d, want %d (pass after %d ms)", got, tc.want, (PassAfter(tc.a, tc.b)-base)/ms)
			}
		})
	}
	if got := JudgePair(nil, Flip{}, Flip{}, timeout); got != Missing {
		t.Errorf("no figures: %d, want missing", got)
	}
}
