package pathjudge

import (
	"slices"
	"strings"
	"testing"
)

// TestPathPeersSampled: above the threshold every node is sender and
// receiver of at least k pairs, both ways.
func TestPathPeersSampled(t *testing.T) {
	var nodes []string
	for i := range 40 {
		nodes = append(nodes, "n"+string(rune('A'+i/26))+string(rune('a'+i%26)))
	}
	peers, how := Peers(nodes, 16, 4)
	if !strings.Contains(how, "sampled") {
		t.Fatalf("sampling %q", how)
	}
	for _, n := range nodes {
		if len(peers[n]) < 4 || len(peers[n]) > 8 {
			t.Errorf("%s: %d peers", n, len(peers[n]))
		}
		for _, p := range peers[n] {
			if !slices.Contains(peers[p], n) {
				t.Errorf("%s→%s without %s→%s", n, p, p, n)
			}
		}
	}
	if all, how := Peers(nodes[:5], 16, 4); how != "every pair" || len(all["nAa"]) != 4 {
		t.Errorf("5 nodes: %q %v", how, all)
	}
}
