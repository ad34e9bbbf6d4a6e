package ringsample

import (
	"fmt"
	"slices"
	"testing"
)

func TestDistances(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want string
	}{
		{1, 3, "[]"}, {2, 3, "[1]"}, {3, 3, "[1 2]"}, {4, 3, "[1 2 3]"}, {5, 3, "[1 2 3 4]"},
		{8, 3, "[2 4 6]"}, {8, 2, "[2 6]"}, {8, 0, "[1 2 3 4 5 6 7]"}, {8, 9, "[1 2 3 4 5 6 7]"},
		{16, 4, "[1 7 9 15]"}, {9, 3, "[1 4 5 8]"}, {64, 1, "[32]"}, {64, 3, "[16 32 48]"},
		{32, 2, "[8 24]"}, {32, 6, "[1 8 15 17 24 31]"},
	} {
		if got := fmt.Sprint(Distances(tc.n, tc.k)); got != tc.want {
			t.Errorf("Distances(%d, %d) = %s, want %s", tc.n, tc.k, got, tc.want)
		}
	}
	// Every size and k: distinct, within 1..n-1, closed under d → n-d,
	// and k of them (k+1 for odd k over odd n).
	for n := 2; n <= 70; n++ {
		for k := 0; k <= n; k++ {
			d := Distances(n, k)
			want := k
			if k <= 0 || k >= n-1 {
				want = n - 1
			} else if k%2 == 1 && n%2 == 1 {
				want = k + 1
			}
			if len(d) != want || len(slices.Compact(slices.Clone(d))) != len(d) {
				t.Fatalf("Distances(%d, %d) = %v: want %d distinct", n, k, d, want)
			}
			for _, x := range d {
				if x < 1 || x > n-1 || !slices.Contains(d, n-x) {
					t.Fatalf("Distances(%d, %d) = %v: %d out of range or without %d", n, k, d, x, n-x)
				}
			}
		}
	}
}
