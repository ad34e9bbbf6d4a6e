package operation

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzStateFileDecode feeds arbitrary bytes to the state-file decoder (the
// record an agent resumes from after a restart). It must never panic; a
// record it accepts must be valid and survive Save and Load unchanged; one
// it refuses must be a StoreError naming the path.
func FuzzStateFileDecode(f *testing.F) {
	f.Add([]byte(`{"id":"op-1","phase":"PREPARED","from_port":4789,"to_port":4889,"snapshot":{"backend":"ovs","device":"vxlan0","from_port":4789,"to_port":4889}}`))
	f.Add([]byte(`{"id":"op-1","phase":"COMMITTED","snapshot":{},"deadline":"2026-01-01T00:00:00Z","deadman_ns":5000000000}`))
	f.Add([]byte(`{"id":"op-1","phase":"REVERTED","reverted_by":"deadman"}`))
	f.Add([]byte(`{"id":"","phase":"IDLE"}`))
	f.Add([]byte(`{"id":"x","phase":"PREPARED"}`))
	f.Add([]byte(`{"id":"x","phase":"BOGUS"}`))
	f.Add([]byte(`{"id":"x","phase":"ABORTED","from_port":70000}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := fuzzDir(t)
		s := FileStore{Dir: dir}
		if err := os.WriteFile(filepath.Join(dir, StateFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := s.Load()
		if err != nil {
			if !IsStoreError(err) {
				t.Fatalf("refusal is not a StoreError: %v", err)
			}
			return
		}
		if r == nil {
			t.Fatalf("nil record without error for %q", data)
		}
		if err := r.valid(); err != nil {
			t.Fatalf("accepted an invalid record: %v", err)
		}
		if err := s.Save(*r); err != nil {
			t.Fatal(err)
		}
		r2, err := s.Load()
		if err != nil {
			t.Fatalf("a saved record does not load again: %v", err)
		}
		a, _ := json.Marshal(r)
		b, _ := json.Marshal(r2)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed the record:\n%s\n%s", a, b)
		}
	})
}

// fuzzDir is a fresh directory on tmpfs when there is one: Save fsyncs,
// and on a disk that caps a fuzz worker at a few executions a second.
func fuzzDir(t *testing.T) string {
	t.Helper()
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "cot-fuzz-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
