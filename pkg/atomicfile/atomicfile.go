// Package atomicfile is the one way Cutover writes a file that a crash must
// never leave torn: the agent's operation record, the coordinator's journal,
// certificates and keys, the lab's state. A reader sees the old content or
// the new, never half of either, and once WriteFile returns the new content
// survives a power loss.
//
// The temporary file, its fsync and the rename come from google/renameio;
// this package adds what renameio leaves to its caller: the temporary file
// lives in the target's own directory (a rename across file systems is not
// atomic), the permissions are exactly the ones asked for (umask ignored:
// a key must be 0600 whatever the process's umask), and the directory is
// fsynced after the rename, without which the rename itself may be lost.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Error is a failed WriteFile: what it was doing, on which path, and why.
type Error struct {
	Op   string // "write" or "fsync dir"
	Path string
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Path, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// WriteFile replaces path with data, mode perm, atomically and durably.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := renameio.WriteFile(path, data, perm, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm)); err != nil {
		return &Error{Op: "write", Path: path, Err: err}
	}
	if err := syncDir(dir); err != nil {
		return &Error{Op: "fsync dir", Path: dir, Err: err}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
