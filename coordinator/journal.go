package coordinator

import (
	"fmt"

	"github.com/cutover-dev/cutover/coordinator/internal/statedir"
)

// describeJournal names where the journal is, for errors.
func describeJournal(j JournalStore, cfg Config) string {
	if s, ok := j.(fmt.Stringer); ok {
		return s.String()
	}
	if _, ok := j.(*statedir.Journal); ok {
		return "--state-dir " + cfg.StateDir
	}
	return fmt.Sprintf("journal %T", j)
}
