package ovs

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rxPort is a staged receive port as the agent adds it: vxlan0's options
// but dst_port, bound to the node IP, at a requested OpenFlow port.
func rxPort(name, port string, ofport int64) Interface {
	o := copyOptions(baseOpts)
	o["dst_port"], o["local_ip"] = port, "198.18.0.11"
	return Interface{Name: name, Type: "vxlan", Options: o, OFPortRequest: ofport}
}

// names is the interfaces of br0, by name.
func names(t *testing.T, d Driver) string {
	t.Helper()
	ifs, err := d.Interfaces(context.Background(), "br0")
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, i := range ifs {
		n = append(n, i.Name)
	}
	return strings.Join(n, " ")
}

// portsContract is the staged strategy's part of the contract: ports added,
// moved and removed in one transaction each, applied by ovs-vswitchd when
// ChangePorts returns.
func portsContract(t *testing.T, mk func(*testing.T) env) {
	ctx := context.Background()

	t.Run("ports: add, switch, unswitch, retire; applied on return; replays", func(t *testing.T) {
		e := mk(t)
		add := PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot", "4889", 65278)}}
		for range 2 {
			if err := e.d.ChangePorts(ctx, add); err != nil {
				t.Fatal(err)
			}
			// The OpenFlow port number is ovs-vswitchd's doing: read at
			// once, it shows the change was applied, not only committed.
			rx, err := e.d.GetInterface(ctx, "vxlan0-cot")
			if err != nil || rx.OFPort != 65278 || rx.OFPortRequest != 65278 || !rx.Healthy() || e.port("vxlan0-cot") != "4889" || rx.Options["local_ip"] != "198.18.0.11" {
				t.Fatalf("added: %s, %v; want ofport 65278, dst_port 4889, bound", rx, err)
			}
		}
		if got := names(t, e.d); got != "br0 vxlan0 vxlan0-cot" {
			t.Fatalf("br0 has %q", got)
		}
		sw := PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot-old", "4789", 65279)}, Move: []Move{{"vxlan0", 4789, 4889}}}
		for range 2 {
			if err := e.d.ChangePorts(ctx, sw); err != nil {
				t.Fatal(err)
			}
			old, err := e.d.GetInterface(ctx, "vxlan0-cot-old")
			if err != nil || old.OFPort != 65279 || !old.Healthy() || e.port("vxlan0") != "4889" {
				t.Fatalf("switched: %s, %v, vxlan0 dst_port %q", old, err, e.port("vxlan0"))
			}
		}
		if got := names(t, e.d); got != "br0 vxlan0 vxlan0-cot vxlan0-cot-old" {
			t.Fatalf("br0 has %q", got)
		}
		unsw := PortsChange{Bridge: "br0", Move: []Move{{"vxlan0", 4889, 4789}}, Del: []string{"vxlan0-cot-old"}}
		for range 2 {
			if err := e.d.ChangePorts(ctx, unsw); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.GetInterface(ctx, "vxlan0-cot-old"); !IsNotFound(err) || e.port("vxlan0") != "4789" {
				t.Fatalf("unswitched: vxlan0-cot-old %v, vxlan0 dst_port %q", err, e.port("vxlan0"))
			}
		}
		retire := PortsChange{Bridge: "br0", Del: []string{"vxlan0-cot", "vxlan0-cot-old"}}
		for range 2 {
			if err := e.d.ChangePorts(ctx, retire); err != nil {
				t.Fatal(err)
			}
			if got := names(t, e.d); got != "br0 vxlan0" {
				t.Fatalf("retired: br0 has %q", got)
			}
		}
		if v, err := e.d.GetInterface(ctx, "vxlan0"); err != nil || v.OFPort != 1 || !v.Healthy() {
			t.Fatalf("vxlan0 after it all: %s, %v", v, err)
		}
	})

	t.Run("ports: a refused move adds nothing", func(t *testing.T) {
		e := mk(t)
		e.setOption("vxlan0", "dst_port", "4999")
		err := e.d.ChangePorts(ctx, PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot-old", "4789", 65279)}, Move: []Move{{"vxlan0", 4789, 4889}}})
		if !IsConflict(err) || !strings.Contains(err.Error(), "4999") {
			t.Fatalf("err = %v, want a conflict naming 4999", err)
		}
		if got := names(t, e.d); got != "br0 vxlan0" || e.port("vxlan0") != "4999" {
			t.Fatalf("after a refused change: br0 has %q, vxlan0 dst_port %q", got, e.port("vxlan0"))
		}
	})

	t.Run("ports: not found", func(t *testing.T) {
		e := mk(t)
		if err := e.d.ChangePorts(ctx, PortsChange{Bridge: "br9", Del: []string{"x"}}); !IsNotFound(err) || !strings.Contains(err.Error(), `bridge "br9"`) {
			t.Fatalf("missing bridge: %v", err)
		}
		if _, err := e.d.Interfaces(ctx, "br9"); !IsNotFound(err) {
			t.Fatalf("Interfaces of a missing bridge: %v", err)
		}
		err := e.d.ChangePorts(ctx, PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot", "4889", 65278)}, Move: []Move{{"nope", 4789, 4889}}})
		if !IsNotFound(err) || names(t, e.d) != "br0 vxlan0" {
			t.Fatalf("missing interface to move: %v, br0 has %q", err, names(t, e.d))
		}
	})

	t.Run("interfaces: types and mtu_request", func(t *testing.T) {
		e := mk(t)
		e.addInternal("tun0", 1450)
		e.addInternal("int1", 0)
		ifs, err := e.d.Interfaces(ctx, "br0")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, i := range ifs {
			got = append(got, i.Name+":"+i.Type+":"+map[bool]string{true: "pinned", false: "unpinned"}[i.MTURequest > 0])
		}
		if want := []string{"br0:internal:unpinned", "int1:internal:unpinned", "tun0:internal:pinned", "vxlan0:vxlan:unpinned"}; !slices.Equal(got, want) {
			t.Fatalf("interfaces %q, want %q", got, want)
		}
		for _, i := range ifs {
			if i.Name == "tun0" && i.MTURequest != 1450 {
				t.Fatalf("tun0 mtu_request %d, want 1450", i.MTURequest)
			}
		}
	})
}

// TestRealPortsOneTransaction changes vxlan0 between ChangePorts' read and
// its write: the move's compare-and-set fails the whole transaction, so the
// port it would have added is not there either (the switch is one
// transaction, as ovs-vsctl's was).
func TestRealPortsOneTransaction(t *testing.T) {
	e, inst, c := realEnv(t)
	c.testHookBeforeWrite = func() {
		if _, err := inst.Vsctl(context.Background(), "set", "interface", "vxlan0", "options:tos=inherit"); err != nil {
			t.Error(err)
		}
	}
	err := c.ChangePorts(context.Background(), PortsChange{Bridge: "br0",
		Add: []Interface{rxPort("vxlan0-cot-old", "4789", 65279)}, Move: []Move{{"vxlan0", 4789, 4889}}})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Err == nil || !strings.Contains(err.Error(), "tos=inherit") {
		t.Fatalf("err = %v, want a conflict from the wait, naming tos=inherit", err)
	}
	if got := names(t, c); got != "br0 vxlan0" || e.port("vxlan0") != "" {
		t.Fatalf("after the refused transaction: br0 has %q, vxlan0 dst_port %q; want neither part written", got, e.port("vxlan0"))
	}
}

// TestRealPortsNotApplied freezes ovs-vswitchd: the ports change commits
// but is not applied, which must be an error; a replay once it runs again
// succeeds with the port running.
func TestRealPortsNotApplied(t *testing.T) {
	_, inst, c := realEnv(t)
	pid := inst.VswitchdPID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	defer cont()
	add := PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot", "4889", 65278)}}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.ChangePorts(ctx, add); !IsNotApplied(err) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "add vxlan0-cot") {
		t.Fatalf("err = %v, want not applied (deadline), naming the change", err)
	}
	cont()
	if err := c.ChangePorts(context.Background(), add); err != nil {
		t.Fatal(err)
	}
	if rx, err := c.GetInterface(context.Background(), "vxlan0-cot"); err != nil || rx.OFPort != 65278 {
		t.Fatalf("replay after vswitchd resumed: %s, %v", rx, err)
	}
}
