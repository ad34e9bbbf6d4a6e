package statedir

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzJournalDecode feeds arbitrary bytes to the journal decoder (what a
// restarted coordinator resumes from). It must never panic, must report a
// file it cannot parse (never drop it silently), and a record it accepts
// must survive Save and Load unchanged.
func FuzzJournalDecode(f *testing.F) {
	f.Add([]byte(`{"id":"op-1","kind":"cutover","from_port":4789,"to_port":4889,"nodes":["n1","n2"],"step_millis":1500,"step":"commit","commit_sent":true,"outcome":"pending","seq":1}`))
	f.Add([]byte(`{"id":"op-2","outcome":"succeeded","report":{"operationId":"op-2"}}`))
	f.Add([]byte(`{"id":"op-3","report":[1,2,3]}`))
	f.Add([]byte(`{"id":"../escape","step_millis":-1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"seq":9223372036854775807}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := fuzzDir(t)
		j, err := OpenJournal(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "operations", "op.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		recs, err := j.Load()
		if err != nil {
			if len(recs) != 0 {
				t.Fatalf("records %v returned with error %v", recs, err)
			}
			return
		}
		if len(recs) != 1 {
			t.Fatalf("%d records from one file, no error", len(recs))
		}
		r := recs[0]
		if r.ID == "" || filepath.Base(r.ID) != r.ID {
			return // Save would write elsewhere; Resume's concern, not the decoder's
		}
		if err := j.Save(r); err != nil {
			return
		}
		again, err := j.Load()
		if err != nil {
			t.Fatalf("a saved record does not load: %v", err)
		}
		for _, a := range again {
			if a.ID == r.ID {
				x, _ := json.Marshal(a)
				y, _ := json.Marshal(r)
				if string(x) != string(y) {
					t.Fatalf("round trip changed the record:\n%s\n%s", y, x)
				}
			}
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
