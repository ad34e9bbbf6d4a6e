//go:build cutover_faultinject

package barrier

// The staged safety checks' bite tests (faultinject_test.go) break one
// rule of the core each and show the check that guards it fails (STYLE.md
// "a safety test must bite"). The switches exist only in a build with the
// tag cutover_faultinject; in the shipped coordinator they are constant
// false (faultinject_off.go) and the compiler drops the broken branch.
var (
	// testNoUnswitch: a staged operation rolls back without switching
	// every sender back first (TestStagedInvariantBites).
	testNoUnswitch bool
	// testNoHold: a subset's run retires the old port instead of holding
	// (TestStagedSubsetBites).
	testNoHold bool
)

func noUnswitch() bool { return testNoUnswitch }

func noHold() bool { return testNoHold }
