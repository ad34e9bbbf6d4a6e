//go:build cutover_faultinject

package coordinator

// The runner's bite test (TestCommitNotSentUnjournaled) breaks one rule
// and shows the test that guards it fails (STYLE.md "a safety test must
// bite"). The switch exists only in a build with the tag
// cutover_faultinject; in the shipped coordinator it is constant false
// (faultinject_off.go).

// testIgnoreJournalErrors: the runner drops a failed journal write and
// performs what followed it, a Commit included.
var testIgnoreJournalErrors bool

func ignoreJournalErrors() bool { return testIgnoreJournalErrors }
