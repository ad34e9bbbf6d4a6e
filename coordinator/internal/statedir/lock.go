package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFile is the name of the lock in --state-dir.
const LockFile = "lock"

// StateDirLockedError is returned when another process holds the
// --state-dir lock: two coordinators on one journal would both drive (and
// a restarted one would "resume", i.e. undo) the same operation.
type StateDirLockedError struct {
	Dir string
	PID int // the holder's, as it wrote it; 0 when unknown
}

func (e *StateDirLockedError) Error() string {
	who := "another process (its PID not written yet)"
	if e.PID > 0 {
		who = fmt.Sprintf("another coordinator, PID %d,", e.PID)
	}
	return fmt.Sprintf("--state-dir %q: in use by %s (lock %s): two coordinators on one journal would drive the same operation; stop that one first, or give this one another --state-dir",
		e.Dir, who, filepath.Join(e.Dir, LockFile))
}

// IsStateDirLocked reports whether err says the state dir is held by
// another process.
func IsStateDirLocked(err error) bool {
	var e *StateDirLockedError
	return errors.As(err, &e)
}

// Lock is an exclusive flock(2) on <state-dir>/lock, held as long as
// the file stays open: the kernel drops it when the process dies, however
// it dies, so a kill -9 leaves no stale lock to clean up. The holder's PID
// is written in the file for the refusal message.
type Lock struct{ f *os.File }

// LockDir takes the lock of dir, or fails at once (never waits) with
// a *StateDirLockedError naming the holder.
func LockDir(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir %q: %w", dir, err)
	}
	p := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--state-dir %q: lock: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b, _ := os.ReadFile(p)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return nil, &StateDirLockedError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("--state-dir %q: flock %s: %w", dir, p, err)
	}
	// Ours: say who holds it. A failure here does not weaken the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock (closing the file releases the flock). The file
// stays: removing it would race with a process that opened it to lock.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}
