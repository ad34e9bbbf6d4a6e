package atomicfile_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cutover-dev/cutover/pkg/atomicfile"
)

func TestWriteFileReplacesWithExactModeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	old := syscall.Umask(0o077) // a umask that would change 0644
	defer syscall.Umask(old)
	for i, body := range []string{"first\n", "second, longer than the first\n", "3\n"} {
		if err := atomicfile.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != body {
			t.Fatalf("write %d: read %q, %v; want %q", i, got, err, body)
		}
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 whatever the umask", st.Mode().Perm())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only state.json (no temporary file left)", names)
	}
}

func TestWriteFileErrorNamesThePath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing-dir", "f")
	err := atomicfile.WriteFile(p, []byte("x"), 0o600)
	var ae *atomicfile.Error
	if !errors.As(err, &ae) || ae.Path != p || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want an *atomicfile.Error for %s wrapping ErrNotExist", err, p)
	}
}
