package operation

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
)

// Check runs outside the operation lock (/readyz, Info and Preflight call
// it while Prepare or Finalize hold the lock and call it too), so any
// number of Checks and a Save may overlap. Each must succeed, and none may
// leave a file behind or disturb the record.
func TestFileStoreCheckConcurrentWithSave(t *testing.T) {
	const checkers, rounds = 8, 300
	s := FileStore{Dir: t.TempDir()}
	snap := dataplane.Snapshot{Backend: "ovs", Device: "vxlan0", FromPort: from, ToPort: to}
	var wg sync.WaitGroup
	errs := make(chan error, checkers*rounds+rounds)
	for range checkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := s.Check(); err != nil {
					errs <- fmt.Errorf("Check: %w", err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range rounds {
			r := Record{ID: fmt.Sprintf("op-%d", i), Phase: PhasePrepared, FromPort: from, ToPort: to, Snapshot: &snap, Updated: t0}
			if err := s.Save(r); err != nil {
				errs <- fmt.Errorf("Save: %w", err)
			}
		}
	}()
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 5 {
		t.Errorf("... and %d more failures", n-5)
	}
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != StateFile {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("state dir holds %v, want only %s", names, StateFile)
	}
	if r, err := s.Load(); err != nil || r == nil || r.ID != fmt.Sprintf("op-%d", rounds-1) {
		t.Errorf("record after the run: %+v %v, want the last one saved", r, err)
	}
}

// A readiness probe during a whole operation must neither fail the
// operation (it used to remove the check file Prepare's own Check had just
// made: "state remove .../.write-check: no such file or directory") nor
// report the state dir as broken.
func TestReadinessDuringOperationOnFileStore(t *testing.T) {
	be := dataplane.NewFake("ovs", "vxlan0", from)
	s := FileStore{Dir: t.TempDir()}
	m, err := New(context.Background(), Options{Backend: be, Store: s, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var notReady []string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if nr := m.NotReady(); len(nr) > 0 {
					mu.Lock()
					notReady = append(notReady, nr...)
					mu.Unlock()
				}
			}
		}()
	}
	ctx := context.Background()
	for i := range 100 {
		id := fmt.Sprintf("op-%d", i)
		a, b := from, to
		if i%2 == 1 {
			a, b = to, from
		}
		if _, err := m.Prepare(ctx, id, a, b); err != nil {
			t.Fatalf("Prepare %s: %v", id, err)
		}
		if _, err := m.Commit(ctx, id, time.Time{}, time.Minute); err != nil {
			t.Fatalf("Commit %s: %v", id, err)
		}
		if _, err := m.Confirm(ctx, id); err != nil {
			t.Fatalf("Confirm %s: %v", id, err)
		}
		if _, err := m.Finalize(ctx, id); err != nil {
			t.Fatalf("Finalize %s: %v", id, err)
		}
	}
	close(stop)
	wg.Wait()
	if len(notReady) > 0 {
		t.Fatalf("NotReady during the operations reported %d problems, first: %q", len(notReady), notReady[0])
	}
}
