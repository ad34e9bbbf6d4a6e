//go:build !cutover_faultinject

package barrier

// The shipped build carries none of the bite tests' switches
// (faultinject.go): the staged rules always hold.

func noUnswitch() bool { return false }

func noHold() bool { return false }
