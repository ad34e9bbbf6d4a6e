package operation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cutover-dev/cutover/pkg/atomicfile"
	"golang.org/x/sys/unix"
)

// StateFile is the name of the operation record inside the state dir.
const StateFile = "operation.json"

// Store keeps the one operation record durably.
type Store interface {
	// Load returns the record, or nil when there is none yet.
	Load() (*Record, error)
	// Save replaces the record atomically: after a crash either the old or
	// the new record is read back, never a mix.
	Save(r Record) error
	// Check reports whether Save would work now (the dir is writable), so
	// that a mutating call can be refused before any dataplane effect.
	Check() error
	// Path names the record's location, for messages.
	Path() string
}

// FileStore is a Store in a directory: write a temporary file, fsync it,
// rename it over StateFile, fsync the directory.
type FileStore struct {
	Dir string
}

var _ Store = FileStore{}

// Path implements Store.
func (s FileStore) Path() string { return filepath.Join(s.Dir, StateFile) }

// Load implements Store.
func (s FileStore) Load() (*Record, error) {
	b, err := os.ReadFile(s.Path())
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil // nothing was ever written there; Check reports the dir
	}
	if err != nil {
		return nil, &StoreError{Op: "read", Path: s.Path(), Err: err}
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, &StoreError{Op: "parse", Path: s.Path(), Err: fmt.Errorf("%w (inspect or move the file away; it may record a change still applied)", err)}
	}
	if err := r.valid(); err != nil {
		return nil, &StoreError{Op: "parse", Path: s.Path(), Err: err}
	}
	return &r, nil
}

// Save implements Store.
func (s FileStore) Save(r Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return &StoreError{Op: "encode", Path: s.Path(), Err: err}
	}
	if err := atomicfile.WriteFile(s.Path(), append(b, '\n'), 0o600); err != nil {
		var ae *atomicfile.Error
		if errors.As(err, &ae) {
			return &StoreError{Op: ae.Op, Path: ae.Path, Err: ae.Err}
		}
		return &StoreError{Op: "write", Path: s.Path(), Err: err}
	}
	return nil
}

// Check implements Store by creating, syncing and removing a probe file: a
// stat of the mode bits would be wrong for root and for read-only mounts.
//
// The probe file is unique to each call (os.CreateTemp) rather than taking
// the operation lock: /readyz, Info and Preflight call Check while Prepare
// or Finalize hold that lock across slow backend calls, and readiness must
// not wait behind them. With one fixed name, two overlapping Checks removed
// each other's file and a readiness probe could fail a Prepare. A crash
// between create and remove leaves one empty .write-check-* file, harmless
// and safe to delete.
func (s FileStore) Check() error {
	f, err := os.CreateTemp(s.Dir, checkPattern)
	if err != nil {
		return &StoreError{Op: "write", Path: filepath.Join(s.Dir, checkPattern), Err: err}
	}
	p := f.Name()
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return &StoreError{Op: "write", Path: p, Err: err}
	}
	if err := os.Remove(p); err != nil {
		return &StoreError{Op: "remove", Path: p, Err: err}
	}
	return nil
}

// checkPattern names Check's probe files (the * is made unique per call).
const checkPattern = ".write-check-*"

// StoreError is a failure to persist or read the operation record. Its
// message names the path and the errno, so an operator can act on it.
type StoreError struct {
	Op   string // read, parse, encode, write, "fsync dir", remove
	Path string
	Err  error
}

func (e *StoreError) Error() string {
	msg := fmt.Sprintf("state %s %s: %v", e.Op, e.Path, unwrapPath(e.Err))
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		msg += " (" + unix.ErrnoName(errno) + ")"
	}
	return msg
}

func (e *StoreError) Unwrap() error { return e.Err }

// unwrapPath avoids repeating the path os.PathError already prints.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// IsStoreError reports whether err is a failure of the state store.
func IsStoreError(err error) bool {
	var se *StoreError
	return errors.As(err, &se)
}
