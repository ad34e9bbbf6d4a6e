package ovs

import (
	"context"
	"testing"
)

// preparedContract is the PreparedChange behaviour, against the fake and
// real Open vSwitch alike (run from contract).
func preparedContract(t *testing.T, mk func(*testing.T) env) {
	ctx := context.Background()

	t.Run("prepare writes nothing, apply flips", func(t *testing.T) {
		e := mk(t)
		e.setOption("vxlan0", "tos", "inherit")
		p, err := e.d.PrepareDstPort(ctx, "vxlan0", 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if got := e.port("vxlan0"); got != "" {
			t.Fatalf("after Prepare dst_port = %q, want absent (nothing written)", got)
		}
		if cur := p.Current(); cur.Options["tos"] != "inherit" {
			t.Fatalf("Current = %s, want the interface as read", cur)
		}
		got, err := p.Apply(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if port, _ := got.DstPort(); port != 4889 || e.port("vxlan0") != "4889" || got.Options["tos"] != "inherit" || !got.Healthy() {
			t.Fatalf("after Apply: %s (option %q), want dst_port=4889, tos kept, healthy", got, e.port("vxlan0"))
		}
		if _, err := p.Apply(ctx); err == nil {
			t.Fatal("second Apply succeeded, want an error (a prepared change applies once)")
		}
	})

	t.Run("row changed after prepare: conflict, nothing written", func(t *testing.T) {
		e := mk(t)
		p, err := e.d.PrepareDstPort(ctx, "vxlan0", 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		e.setOption("vxlan0", "tos", "inherit") // another controller, after the build
		_, err = p.Apply(ctx)
		if !IsConflict(err) {
			t.Fatalf("Apply after the row changed: %v, want a conflict (stale options must not be applied)", err)
		}
		if got := e.port("vxlan0"); got != "" {
			t.Fatalf("dst_port = %q after a refused Apply, want absent", got)
		}
		now, err := e.d.GetInterface(ctx, "vxlan0")
		if err != nil || now.Options["tos"] != "inherit" {
			t.Fatalf("interface %s, %v: the other controller's change must stand", now, err)
		}
	})

	t.Run("prepare refuses what SetDstPort refuses", func(t *testing.T) {
		e := mk(t)
		if p, err := e.d.PrepareDstPort(ctx, "vxlan0", 4999, 4889); !IsConflict(err) {
			t.Fatalf("prepare from the wrong port: %v, want a conflict", err)
		} else {
			p.Close()
		}
		if p, err := e.d.PrepareDstPort(ctx, "nosuch", 4789, 4889); !IsNotFound(err) {
			t.Fatalf("prepare a missing interface: %v, want not found", err)
		} else {
			p.Close()
		}
	})
}

func TestPreparedContract(t *testing.T) {
	for _, sys := range []string{"fake", "real"} {
		t.Run(sys, func(t *testing.T) {
			preparedContract(t, func(t *testing.T) env {
				if sys == "fake" {
					return fakeEnv(t)
				}
				e, _, _ := realEnv(t)
				return e
			})
		})
	}
}

// TestRealPreparedOneMessage: at the instant, Apply sends the transaction and,
// once ovs-vswitchd applied it, the read-back; the read, the build and the
// cur_cfg watch all happened in Prepare.
func TestRealPreparedOneMessage(t *testing.T) {
	e, _, c := realEnv(t)
	ctx := context.Background()
	p, err := c.PrepareDstPort(ctx, "vxlan0", 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var sent uint64
	c.testHookBeforeWrite = func() { sent = c.conn.Requests() }
	before := c.conn.Requests()
	if _, err := p.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if sent != before {
		t.Fatalf("%d requests between Apply's start and its write, want 0", sent-before)
	}
	if n := c.conn.Requests() - before; n != 2 {
		t.Fatalf("Apply sent %d requests, want 2 (the transaction, then the read-back)", n)
	}
	if got := e.port("vxlan0"); got != "4889" {
		t.Fatalf("dst_port = %q, want 4889", got)
	}
}

// TestRealPreparedAfterConnectionLoss: ovsdb-server dropped the connection
// between Prepare and Apply (restart). The transaction is resent on a fresh
// connection with a fresh watch, and its compare-and-set still decides:
// unchanged row → applied; changed row → conflict.
func TestRealPreparedAfterConnectionLoss(t *testing.T) {
	for _, changed := range []bool{false, true} {
		name := "unchanged"
		if changed {
			name = "changed"
		}
		t.Run(name, func(t *testing.T) {
			e, _, c := realEnv(t)
			ctx := context.Background()
			p, err := c.PrepareDstPort(ctx, "vxlan0", 4789, 4889)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c.mu.Lock()
			_ = c.conn.Close()
			c.mu.Unlock()
			if changed {
				e.setOption("vxlan0", "tos", "inherit")
			}
			got, err := p.Apply(ctx)
			if changed {
				if !IsConflict(err) || e.port("vxlan0") != "" {
					t.Fatalf("Apply: %s, %v; dst_port %q: want a conflict and nothing written", got, err, e.port("vxlan0"))
				}
				return
			}
			if err != nil || e.port("vxlan0") != "4889" {
				t.Fatalf("Apply after reconnect: %s, %v; dst_port %q: want applied", got, err, e.port("vxlan0"))
			}
		})
	}
}

// TestPreparedCASBites: without the compare-and-set on the row's options, a
// change prepared before another controller's edit writes the options as
// read at Prepare and silently undoes that edit — what the "row changed
// after prepare" case of preparedContract must catch.
func TestPreparedCASBites(t *testing.T) {
	e, _, c := realEnv(t)
	c.testNoCAS = true
	ctx := context.Background()
	p, err := c.PrepareDstPort(ctx, "vxlan0", 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e.setOption("vxlan0", "tos", "inherit")
	if _, err := p.Apply(ctx); IsConflict(err) {
		t.Fatalf("Apply without the CAS: %v; the switch did not take the guard out, so the bite proves nothing", err)
	}
	now, err := c.GetInterface(ctx, "vxlan0")
	if err != nil {
		t.Fatal(err)
	}
	if now.Options["tos"] == "inherit" {
		t.Fatalf("without the CAS the other controller's tos survived (%s): the guarded case would pass without its guard", now)
	}
}
