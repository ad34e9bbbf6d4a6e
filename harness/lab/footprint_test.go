package lab_test

import (
	"strings"
	"testing"
)

// TestFootprintProbes: BenchmarkAgentFootprint's COT_FOOTPRINT_PROBES picks
// rows in the benchmark's order, all when empty, and refuses a row it does
// not know by name.
func TestFootprintProbes(t *testing.T) {
	for spec, want := range map[string]string{
		"":                    "probing idle off probing-1ms",
		"probing-1ms,probing": "probing probing-1ms",
		"off":                 "off",
	} {
		got, err := footprintProbes(spec)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("footprintProbes(%q) = %v, %v; want %s", spec, got, err, want)
		}
	}
	_, err := footprintProbes("probing,probing-2ms")
	if err == nil || !strings.Contains(err.Error(), `COT_FOOTPRINT_PROBES="probing,probing-2ms": row "probing-2ms"`) {
		t.Errorf("footprintProbes(probing,probing-2ms): %v, want an error naming the variable, the value and the row", err)
	}
}
