//go:build cutover_faultinject

package probe

import "testing"

// TestRidingAnswersSpareOlderAgentsBites: a mesh that puts its answers in
// its probes to every peer, without the peer's word that it reads them,
// starves an older agent of its answers; TestRidingAnswersSpareOlderAgents
// must catch that.
func TestRidingAnswersSpareOlderAgentsBites(t *testing.T) {
	rideAll = true
	t.Cleanup(func() { rideAll = false })
	got := olderAgentExchange(t)
	if got.rode == 0 || got.oldAnswered >= got.oldSent {
		t.Fatalf("with answers riding to every peer the older agent still had %d of its %d probes answered (%d rode): TestRidingAnswersSpareOlderAgents would not catch it", got.oldAnswered, got.oldSent, got.rode)
	}
	t.Logf("mutation caught: the older agent had %d of its %d probes answered, %d answers rode", got.oldAnswered, got.oldSent, got.rode)
}
