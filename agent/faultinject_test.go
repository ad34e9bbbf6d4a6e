//go:build !cutover_faultinject

package agent

import "testing"

// The default build ignores the fault-injection variable: nothing set on a
// node can make the shipped agent flip before the barrier.
func TestFaultInjectionOffByDefault(t *testing.T) {
	t.Setenv("COT_FAULTINJECT_FLIP_AT_PREPARE", "n1")
	if FaultInjectBuilt || flipAtPrepare("n1") {
		t.Fatal("the default agent build honours the I2 fault-injection switch")
	}
	t.Setenv("COT_FAULTINJECT_PATH_PASSES", "n1")
	if pathAlwaysPasses("n1") {
		t.Fatal("the default agent build honours the path check fault-injection switch")
	}
	t.Setenv("COT_FAULTINJECT_FLIP_DELAY", "150ms")
	if flipDelay() != nil {
		t.Fatal("the default agent build honours the flip delay fault-injection switch")
	}
	t.Setenv("COT_FAULTINJECT_PATH_WIRE", "n1")
	if pathWireAlways("n1") {
		t.Fatal("the default agent build honours the path check capture fault-injection switch")
	}
}
