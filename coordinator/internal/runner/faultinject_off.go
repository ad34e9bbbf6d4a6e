//go:build !cutover_faultinject

package runner

// The shipped build carries none of the bite tests' switches
// (faultinject.go).

func ignoreJournalErrors() bool { return false }
