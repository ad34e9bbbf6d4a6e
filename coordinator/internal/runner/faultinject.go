//go:build cutover_faultinject

package runner

// The runner's bite test (coordinator's TestCommitNotSentUnjournaledBites)
// breaks one rule and shows the test that guards it fails (STYLE.md "a
// safety test must bite"). The switch exists only in a build with the tag
// cutover_faultinject; in the shipped coordinator it is constant false
// (faultinject_off.go).

var testIgnoreJournalErrors bool

// IgnoreJournalErrors, set, makes the runner drop a failed journal write
// and perform what followed it, a Commit included.
func IgnoreJournalErrors(on bool) { testIgnoreJournalErrors = on }

func ignoreJournalErrors() bool { return testIgnoreJournalErrors }
