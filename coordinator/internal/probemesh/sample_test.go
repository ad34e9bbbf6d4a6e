package probemesh

import (
	"fmt"
	"slices"
	"testing"
)

func TestProbeSample(t *testing.T) {
	for _, tc := range []struct {
		n, k, want int // want: peers per node
	}{
		{1, 3, 0}, {2, 3, 1}, {3, 3, 2}, {4, 3, 3}, {5, 3, 4}, {8, 3, 3}, {8, 0, 7}, {8, 7, 7}, {8, 9, 7},
		{64, 3, 3}, {64, 1, 1}, {65, 64, 64}, {10, 4, 4}, {9, 3, 4}, {9, 4, 4}, {33, 3, 4}, {32, 3, 3}, {1000, 3, 3}, {1000, 8, 8},
	} {
		t.Run(fmt.Sprintf("n%d_k%d", tc.n, tc.k), func(t *testing.T) {
			var nodes []string
			for i := range tc.n {
				nodes = append(nodes, fmt.Sprintf("node-%03d", i))
			}
			// Shuffled and duplicated input gives the same sample.
			in := append(slices.Clone(nodes), nodes[0])
			slices.Reverse(in)
			s := Sample(in, tc.k)
			if !mapsEqual(s, Sample(nodes, tc.k)) {
				t.Fatal("sample depends on the input order")
			}
			probedBy := map[string]int{}
			for _, from := range nodes {
				peers := s[from]
				if len(peers) != tc.want {
					t.Fatalf("%s probes %d peers %v, want %d", from, len(peers), peers, tc.want)
				}
				if slices.Contains(peers, from) {
					t.Fatalf("%s probes itself", from)
				}
				if len(slices.Compact(slices.Clone(peers))) != len(peers) {
					t.Fatalf("%s probes a peer twice: %v", from, peers)
				}
				for _, p := range peers {
					probedBy[p]++
					// Symmetric: the peer probes back, so answers ride.
					if !slices.Contains(s[p], from) {
						t.Fatalf("%s probes %s, which does not probe it back", from, p)
					}
				}
			}
			for _, n := range nodes {
				if tc.want > 0 && probedBy[n] != tc.want {
					t.Errorf("%s probed by %d, want %d", n, probedBy[n], tc.want)
				}
			}
		})
	}
}

// The ring spread: with 8 nodes and k=3 node 0 probes the nodes at the
// middle distance both ways (2 and 6) and the node opposite (4); with 16
// and k=4, distances 1, 7, 9 and 15, near and far.
func TestProbeSampleSpread(t *testing.T) {
	s := Sample([]string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"}, 3)
	if got := fmt.Sprint(s["n0"], s["n6"]); got != "[n2 n4 n6] [n0 n2 n4]" {
		t.Errorf("n0, n6 probe %s", got)
	}
	pairs := Pairs(s, []string{"n6", "n0"})
	if got := fmt.Sprint(pairs); got != "[n0→n2 n0→n4 n0→n6 n6→n0 n6→n2 n6→n4]" {
		t.Errorf("pairs %s", got)
	}
	if got := fmt.Sprint(Sample([]string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"}, 4)["a"]); got != "[b h j p]" {
		t.Errorf("16 nodes, k=4: a probes %s", got)
	}
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
