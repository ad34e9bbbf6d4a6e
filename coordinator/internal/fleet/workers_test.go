package fleet

import (
	"sync"
	"testing"
	"time"
)

// TestWorkersRunAtOnce: every function runs at once, however many block:
// each waits until all of them have started, which a pool that made one
// wait for another would never let happen.
func TestWorkersRunAtOnce(t *testing.T) {
	w := &workers{idle: time.Minute, work: make(chan func())}
	const n = 200
	var started sync.WaitGroup
	started.Add(n)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	var done sync.WaitGroup
	done.Add(n)
	go func() { // a pool that made a call wait would block here
		for range n {
			w.run(func() {
				defer done.Done()
				started.Done()
				<-all
			})
		}
	}()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("not every function started within 10 s: workers made some wait for others (%d started)", w.started.Load())
	}
	done.Wait()
}

// TestWorkersReused: a function run after others ended goes to an idle
// worker, not a new goroutine; idle workers end after idle.
func TestWorkersReused(t *testing.T) {
	w := &workers{idle: 2 * time.Second, work: make(chan func())}
	round := func(k int) {
		var wg sync.WaitGroup
		wg.Add(k)
		for range k {
			w.run(wg.Done)
		}
		wg.Wait()
	}
	round(50)
	first := w.started.Load()
	if first < 1 || first > 50 {
		t.Fatalf("the first round of 50 started %d goroutine(s); want 1 to 50", first)
	}
	// Wait until the workers are back in their receive: a send to one
	// that is still returning from its function would start another.
	time.Sleep(200 * time.Millisecond)
	round(int(first))
	if got := w.started.Load(); got != first {
		t.Fatalf("a second round of %d, with %d worker(s) idle, started %d more goroutine(s); want 0", first, first, got-first)
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.live.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d worker(s) still live 10 s after their last function; want none after %s idle", w.live.Load(), w.idle)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
