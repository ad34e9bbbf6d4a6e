package dataplane

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFakeStates replays every Backend step twice (idempotency) and
// compares the canonical dump after each.
func TestFakeStates(t *testing.T) {
	ctx := context.Background()
	f := NewFake("ovs", "vxlan0", 4789)
	if _, err := f.Snapshot(ctx, 4000, 4889); err == nil || !strings.Contains(err.Error(), "not from_port 4000") {
		t.Fatalf("snapshot from the wrong port: %v", err)
	}
	s, err := f.Snapshot(ctx, 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"prepare", func() error { return f.Prepare(ctx, s) }, "port=4789 fw=[4789 4889]"},
		{"abort", func() error { return f.Abort(ctx, s) }, "port=4789 fw=[4789]"},
		{"prepare again", func() error { return f.Prepare(ctx, s) }, "port=4789 fw=[4789 4889]"},
		{"commit", func() error { _, err := f.Commit(ctx, s); return err }, "port=4889 fw=[4789 4889]"},
		{"revert", func() error { _, err := f.Revert(ctx, s); return err }, "port=4789 fw=[4789]"},
		{"commit again", func() error { f.Prepare(ctx, s); _, err := f.Commit(ctx, s); return err }, "port=4889 fw=[4789 4889]"},
		{"finalize", func() error { return f.Finalize(ctx, s) }, "port=4889 fw=[4889]"},
		{"revert after finalize", func() error { _, err := f.Revert(ctx, s); return err }, "port=4789 fw=[4789]"},
	}
	for _, st := range steps {
		for range 2 {
			if err := st.do(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			if got := f.Dump(); got != st.want {
				t.Fatalf("%s: dump %q, want %q", st.name, got, st.want)
			}
		}
	}
}

func TestFakeKeepsAnOpeningItDidNotMake(t *testing.T) {
	ctx := context.Background()
	f := NewFake("kernel-vxlan", "flannel.1", 8472)
	f.SetFirewall(8472, 4789)
	s, _ := f.Snapshot(ctx, 8472, 4789)
	f.Prepare(ctx, s)
	f.Abort(ctx, s)
	if got := f.Dump(); got != "port=8472 fw=[4789 8472]" {
		t.Fatalf("abort closed a pre-existing opening: %s", got)
	}
}

func TestFakeFailuresAndLatency(t *testing.T) {
	ctx := context.Background()
	f := NewFake("ovs", "vxlan0", 4789)
	s, _ := f.Snapshot(ctx, 4789, 4889)
	boom := errors.New("boom")
	f.FailNext(MethodPrepare, boom)
	if err := f.Prepare(ctx, s); !errors.Is(err, boom) {
		t.Fatalf("FailNext: %v", err)
	}
	if f.Dump() != "port=4789 fw=[4789]" || len(f.Calls()) != 0 {
		t.Fatalf("a failed call had an effect: %s %q", f.Dump(), f.Calls())
	}
	if err := f.Prepare(ctx, s); err != nil {
		t.Fatalf("FailNext fired twice: %v", err)
	}
	f.SetFailure(MethodCommit, boom)
	for range 2 {
		if _, err := f.Commit(ctx, s); !errors.Is(err, boom) {
			t.Fatalf("SetFailure: %v", err)
		}
	}
	f.SetFailure(MethodCommit, nil)
	f.SetLatency(MethodCommit, 20*time.Millisecond)
	start := time.Now()
	if _, err := f.Commit(ctx, s); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("latency: %v after %v", err, time.Since(start))
	}
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if _, err := f.Commit(cctx, s); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("latency ignores the context: %v", err)
	}
	f.SetNotReady("ovsdb down")
	if nr := f.Ready(ctx); len(nr) != 1 || nr[0] != "ovsdb down" {
		t.Fatalf("Ready = %q", nr)
	}
	c, _ := f.Preflight(ctx, 4889)
	if c.CurrentPort != 4889 || len(c.Problems) != 2 { // already current + not ready
		t.Fatalf("preflight: %+v", c)
	}
}

func TestFakeConcurrent(t *testing.T) {
	ctx := context.Background()
	f := NewFake("ovs", "vxlan0", 4789)
	s, _ := f.Snapshot(ctx, 4789, 4889)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				f.Prepare(ctx, s)
				f.Commit(ctx, s)
				f.Read(ctx)
				f.Revert(ctx, s)
				_ = f.Dump()
			}
		})
	}
	wg.Wait()
	if got := f.Dump(); got != "port=4789 fw=[4789]" {
		t.Fatalf("after concurrent cycles: %s", got)
	}
}
