//go:build !cutover_faultinject

package machineconfig

// The shipped build has no driver that skips the drain (faultinject.go):
// every drain request is answered only once the node is drained.
func (*Driver) answersWithoutDrain() bool { return false }
