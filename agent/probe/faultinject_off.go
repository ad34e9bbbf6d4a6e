//go:build !cutover_faultinject

package probe

// FaultInjectBuilt says whether this binary carries the test-only meter
// mutation (faultinject.go, build tag cutover_faultinject). The shipped
// agent never does: dropAnswer and hiddenLoss are constant false.
const FaultInjectBuilt = false

func dropAnswer(uint64) bool { return false }

func hiddenLoss() bool { return false }

func rideToAll() bool { return false }
