package sdnsim

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

type fixedPort uint16

func (p fixedPort) VXLANPort(context.Context) (uint16, error) { return uint16(p), nil }

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func runAsync(t *testing.T, c Config) (chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c) }()
	return done, cancel
}

func wait(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func TestStartFindsNodeSetUpAndDoesNotRebuild(t *testing.T) {
	f := NewFake(4889)
	ev := &syncBuf{}
	done, cancel := runAsync(t, Config{Source: fixedPort(4889), Node: f, HealthInterval: 5 * time.Millisecond, Events: ev})
	time.Sleep(30 * time.Millisecond)
	cancel()
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if f.Rebuilds != 0 || !strings.Contains(ev.String(), "start port=4889 setup=already") || !strings.Contains(ev.String(), "health ok on=interval") {
		t.Fatalf("events:\n%s\n%s", ev, f.Dump())
	}
}

func TestStartOnAnotherPortRebuilds(t *testing.T) {
	f := NewFake(4889) // the cutover moved it; the ClusterNetwork still says 4789
	ev := &syncBuf{}
	done, cancel := runAsync(t, Config{Source: fixedPort(4789), Node: f, HealthInterval: time.Hour, Events: ev})
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	want := "vxlan0 dst_port=4789\ntable=253 note:00.0b\ndrop udp_dst=4789\nOPENSHIFT-FIREWALL-ALLOW 4789\nOPENSHIFT-NOTRACK 4789\nrebuilds 1\n"
	if f.Dump() != want {
		t.Fatalf("after start:\n%s\nwant\n%s\nevents:\n%s", f.Dump(), want, ev)
	}
}

func TestHealthCheckExitsOnMismatch(t *testing.T) {
	for _, on := range []string{"interval", "reconnect"} {
		f := NewFake(4789)
		ev := &syncBuf{}
		interval := 10 * time.Millisecond
		if on == "reconnect" {
			interval = time.Hour
		}
		done, _ := runAsync(t, Config{Source: fixedPort(4789), Node: f, HealthInterval: interval, Events: ev})
		waitFor(t, ev, "EVENT ready")
		f.SetPort(4889)
		if on == "reconnect" {
			f.DropConnection()
		}
		err := wait(t, done)
		if !IsHealth(err) || !strings.Contains(err.Error(), "dst_port is 4889, the ClusterNetwork said 4789") {
			t.Fatalf("%s: Run = %v", on, err)
		}
		if !strings.Contains(ev.String(), "health failed on="+on) {
			t.Fatalf("%s: events:\n%s", on, ev)
		}
	}
}

func TestNoHealthCheckImageKeepsRunning(t *testing.T) {
	f := NewFake(4789)
	ev := &syncBuf{}
	done, cancel := runAsync(t, Config{Source: fixedPort(4789), Node: f, HealthInterval: 5 * time.Millisecond, NoHealthCheck: true, Events: ev})
	waitFor(t, ev, "EVENT ready")
	f.SetPort(4889)
	time.Sleep(40 * time.Millisecond)
	cancel()
	if err := wait(t, done); err != nil {
		t.Fatalf("patched image exited: %v", err)
	}
	if !strings.Contains(ev.String(), "health failed-ignored") || f.Rebuilds != 0 {
		t.Fatalf("events:\n%s", ev)
	}
}

// The firewall re-sync keeps the SDN's own rule and, when it is missing,
// flushes the chain: a new-port rule a cutover added is lost with it.
func TestFirewallSyncFlushesWhenItsRuleIsMissing(t *testing.T) {
	f := NewFake(4789)
	f.Allow[4889] = true
	if err := f.SyncFirewall(context.Background(), 4789); err != nil {
		t.Fatal(err)
	}
	if !f.Allow[4889] {
		t.Fatal("an extra rule was removed while the SDN's own was present")
	}
	delete(f.Allow, 4789) // a finalize removed the old port's rule under a still-old SDN
	_ = f.SyncFirewall(context.Background(), 4789)
	if f.Allow[4889] || !f.Allow[4789] {
		t.Fatalf("sync did not flush: %v", f.Allow)
	}
}

func waitFor(t *testing.T, ev *syncBuf, s string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if strings.Contains(ev.String(), s) {
			return
		}
	}
	t.Fatalf("no %q in\n%s", s, ev)
}
