//go:build cutover_faultinject

package machineconfig

// drainless is the driver the drain guard's bite test (TestDrainGuardBites,
// faultinject_test.go) breaks: it answers the MCD's drain request without
// draining, so that the guard can be shown to catch a node rebooted with
// its pods still on it. It exists only in a build with the tag
// cutover_faultinject; in the shipped coordctl no driver skips the drain
// (faultinject_off.go).
var drainless *Driver

func (d *Driver) answersWithoutDrain() bool { return d == drainless }
