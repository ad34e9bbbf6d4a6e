package ovs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// env is one system under test: the driver plus ways to act on the system
// behind the driver's back and to read it back independently.
type env struct {
	d Driver
	// addVxlan adds a vxlan interface with key=flow remote_ip=flow plus extra.
	addVxlan func(name string, extra map[string]string)
	// setOption changes an option as another controller would.
	setOption func(name, key, value string)
	// breakPort makes ovs-vswitchd fail the interface.
	breakPort func(name string)
	// port reads options:dst_port independently ("" when absent).
	port func(name string) string
	// addInternal adds an internal port to br0, with mtu_request when
	// mtu > 0.
	addInternal func(name string, mtu int64)
}

var baseOpts = map[string]string{"remote_ip": "flow", "key": "flow"}

func fakeEnv(t *testing.T) env {
	f := NewFake()
	f.SetPort("br0", Interface{Name: "br0", Type: "internal", OFPort: 65534})
	f.SetPort("br0", Interface{Name: "vxlan0", Type: "vxlan", Options: baseOpts, OFPort: 1, OFPortRequest: 1})
	return env{
		d: f,
		addVxlan: func(name string, extra map[string]string) {
			o := copyOptions(baseOpts)
			for k, v := range extra {
				o[k] = v
			}
			f.SetPort("br0", Interface{Name: name, Type: "vxlan", Options: o})
		},
		addInternal: func(name string, mtu int64) {
			f.SetPort("br0", Interface{Name: name, Type: "internal", MTURequest: mtu})
		},
		setOption: func(name, key, value string) {
			i, err := f.GetInterface(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			i.Options[key] = value
			f.Set(i)
		},
		breakPort: func(name string) {
			i, _ := f.GetInterface(context.Background(), name)
			i.Options["remote_ip"] = "bad"
			i.OFPort, i.Error = -1, "vxlan0: bad vxlan 'remote_ip'"
			f.Set(i)
			f.FailPort(name, i.Error)
		},
		port: func(name string) string {
			i, err := f.GetInterface(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			return i.Options["dst_port"]
		},
	}
}

// startOVS runs a private OVS with br0 and vxlan0 (as OpenShift SDN sets it
// up) in a fresh netns.
func startOVS(t testing.TB) *ovsproc.Instance {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl")
	ns := testenv.Netns(t, "cot-ovs")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: t.TempDir(), Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	if _, err := inst.Vsctl(ctx, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
		"--", "add-port", "br0", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "ofport_request=1"); err != nil {
		t.Fatal(err)
	}
	return inst
}

func realEnv(t *testing.T) (env, *ovsproc.Instance, *Client) {
	inst := startOVS(t)
	c, err := New(Config{Addr: "unix:" + inst.DBSock, ApplyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	vsctl := func(args ...string) string {
		out, err := inst.Vsctl(context.Background(), args...)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	return env{
		d: c,
		addVxlan: func(name string, extra map[string]string) {
			args := []string{"add-port", "br0", name, "--", "set", "interface", name, "type=vxlan", "options:remote_ip=flow", "options:key=flow"}
			for k, v := range extra {
				args = append(args, "options:"+k+"="+v)
			}
			vsctl(args...)
		},
		setOption: func(name, key, value string) { vsctl("set", "interface", name, "options:"+key+"="+value) },
		addInternal: func(name string, mtu int64) {
			args := []string{"add-port", "br0", name, "--", "set", "interface", name, "type=internal"}
			if mtu > 0 {
				args = append(args, "mtu_request="+strconv.FormatInt(mtu, 10))
			}
			vsctl(args...)
		},
		breakPort: func(name string) { vsctl("set", "interface", name, "options:remote_ip=bad") },
		port: func(name string) string {
			out, err := inst.Vsctl(context.Background(), "--if-exists", "get", "interface", name, "options:dst_port")
			if err != nil {
				t.Fatal(err)
			}
			return strings.Trim(strings.TrimSpace(out), `"`)
		},
	}, inst, c
}

// TestDriverContract runs one set of behaviours against the fake and against
// real Open vSwitch 3.1 (userspace datapath): the fake must behave like OVS.
func TestDriverContract(t *testing.T) {
	for _, sys := range []string{"fake", "real"} {
		t.Run(sys, func(t *testing.T) {
			mk := func(t *testing.T) env {
				if sys == "fake" {
					return fakeEnv(t)
				}
				e, _, _ := realEnv(t)
				return e
			}
			contract(t, mk)
		})
	}
}

func contract(t *testing.T, mk func(*testing.T) env) {
	ctx := context.Background()

	t.Run("flip and back, read back, other options kept", func(t *testing.T) {
		e := mk(t)
		e.setOption("vxlan0", "tos", "inherit")
		if err := e.d.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		before, err := e.d.GetInterface(ctx, "vxlan0")
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := before.DstPort(); p != 4789 || e.port("vxlan0") != "" {
			t.Fatalf("start: DstPort %d, option %q; want 4789 by default, option absent", p, e.port("vxlan0"))
		}
		for _, step := range []struct{ from, to uint16 }{{4789, 4889}, {4889, 4789}} {
			got, err := e.d.SetDstPort(ctx, "vxlan0", step.from, step.to)
			if err != nil {
				t.Fatalf("%d->%d: %v", step.from, step.to, err)
			}
			if p, _ := got.DstPort(); p != step.to || !got.Healthy() || got.OFPort != before.OFPort {
				t.Fatalf("%d->%d: returned %s", step.from, step.to, got)
			}
			if rb := e.port("vxlan0"); rb != strconv.Itoa(int(step.to)) {
				t.Fatalf("%d->%d: independent read-back dst_port=%q", step.from, step.to, rb)
			}
			for k, v := range map[string]string{"remote_ip": "flow", "key": "flow", "tos": "inherit"} {
				if got.Options[k] != v {
					t.Fatalf("option %s=%q after flip, want %q (options %v)", k, got.Options[k], v, got.Options)
				}
			}
		}
	})

	t.Run("replay and from==to are no-ops", func(t *testing.T) {
		e := mk(t)
		if _, err := e.d.SetDstPort(ctx, "vxlan0", 4789, 4889); err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct{ from, to uint16 }{{4789, 4889}, {4889, 4889}} {
			got, err := e.d.SetDstPort(ctx, "vxlan0", step.from, step.to)
			if err != nil {
				t.Fatalf("replay %d->%d: %v", step.from, step.to, err)
			}
			if p, _ := got.DstPort(); p != 4889 {
				t.Fatalf("replay returned port %d", p)
			}
		}
		// Absent dst_port is 4789: 4789->4789 on a fresh interface is a no-op.
		e.addVxlan("vxlan9", map[string]string{"key": "9"})
		if _, err := e.d.SetDstPort(ctx, "vxlan9", 4789, 4789); err != nil || e.port("vxlan9") != "" {
			t.Fatalf("no-op wrote: err %v, dst_port %q", err, e.port("vxlan9"))
		}
	})

	t.Run("compare-and-set refused when changed behind our back", func(t *testing.T) {
		e := mk(t)
		e.setOption("vxlan0", "dst_port", "4999")
		_, err := e.d.SetDstPort(ctx, "vxlan0", 4789, 4889)
		if !IsConflict(err) {
			t.Fatalf("err = %v, want conflict", err)
		}
		if !strings.Contains(err.Error(), "4999") {
			t.Fatalf("conflict error %q does not say what it found", err)
		}
		if rb := e.port("vxlan0"); rb != "4999" {
			t.Fatalf("dst_port = %q after a refused CAS, want 4999 untouched", rb)
		}
	})

	t.Run("not found", func(t *testing.T) {
		e := mk(t)
		if _, err := e.d.GetInterface(ctx, "nope"); !IsNotFound(err) {
			t.Fatalf("GetInterface: %v", err)
		}
		if _, err := e.d.SetDstPort(ctx, "nope", 4789, 4889); !IsNotFound(err) {
			t.Fatalf("SetDstPort: %v", err)
		}
	})

	t.Run("failed port surfaces as an error", func(t *testing.T) {
		e := mk(t)
		e.breakPort("vxlan0")
		got, err := e.d.SetDstPort(ctx, "vxlan0", 4789, 4889)
		var pe *PortError
		if !errors.As(err, &pe) || !pe.Applied {
			t.Fatalf("err = %v, want applied PortError", err)
		}
		if got.OFPort != -1 || !strings.Contains(got.Error, "remote_ip") {
			t.Fatalf("interface %s: want ofport -1 and the remote_ip error", got)
		}
		if rb := e.port("vxlan0"); rb != "4889" {
			t.Fatalf("dst_port %q; the change is in the database and should read back", rb)
		}
	})

	t.Run("duplicate tunnel refused before writing", func(t *testing.T) {
		e := mk(t)
		e.addVxlan("vxlan1", map[string]string{"dst_port": "4889"})
		_, err := e.d.SetDstPort(ctx, "vxlan0", 4789, 4889)
		var pe *PortError
		if !errors.As(err, &pe) || pe.Applied || !strings.Contains(err.Error(), "vxlan1") {
			t.Fatalf("err = %v, want unapplied PortError naming vxlan1", err)
		}
		if rb := e.port("vxlan0"); rb != "" {
			t.Fatalf("dst_port = %q after a refused change, want absent", rb)
		}
		// The same move onto an implicit 4789 is caught too.
		if _, err := e.d.SetDstPort(ctx, "vxlan1", 4889, 4789); !IsPortError(err) {
			t.Fatalf("vxlan1 -> 4789 beside vxlan0 on implicit 4789: %v", err)
		}
	})

	portsContract(t, mk)
}

// TestRealOVSAcceptsDuplicateTunnels documents why the driver guards against
// duplicates itself: OVS 3.1's userspace datapath takes two vxlan ports with
// identical options without failing either (only a log warning).
func TestRealOVSAcceptsDuplicateTunnels(t *testing.T) {
	e, inst, _ := realEnv(t)
	e.addVxlan("vxlan1", map[string]string{"dst_port": "4889"})
	e.setOption("vxlan0", "dst_port", "4889")
	for _, name := range []string{"vxlan0", "vxlan1"} {
		out, err := inst.Vsctl(context.Background(), "get", "interface", name, "ofport", "error")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out)
		if len(f) != 2 || f[0] == "-1" || f[1] != "[]" {
			t.Fatalf("%s: ofport/error = %q; OVS now fails duplicates itself, revisit the driver's guard", name, out)
		}
	}
}

// TestRealCASRace changes the interface between the driver's read and its
// write: the transaction's wait op must refuse the write.
func TestRealCASRace(t *testing.T) {
	for _, tc := range []struct{ key, value string }{{"dst_port", "4999"}, {"tos", "inherit"}} {
		t.Run(tc.key, func(t *testing.T) {
			e, inst, c := realEnv(t)
			c.testHookBeforeWrite = func() {
				if _, err := inst.Vsctl(context.Background(), "set", "interface", "vxlan0", "options:"+tc.key+"="+tc.value); err != nil {
					t.Error(err)
				}
			}
			_, err := c.SetDstPort(context.Background(), "vxlan0", 4789, 4889)
			if !IsConflict(err) {
				t.Fatalf("err = %v, want conflict", err)
			}
			var ce *ConflictError
			if errors.As(err, &ce); ce.Err == nil || !strings.Contains(err.Error(), tc.value) {
				t.Fatalf("conflict %v: want the wait failure wrapped and the new value named", err)
			}
			want := ""
			if tc.key == "dst_port" {
				want = "4999"
			}
			if rb := e.port("vxlan0"); rb != want {
				t.Fatalf("dst_port = %q, want %q (our write refused)", rb, want)
			}
		})
	}
}

// TestRealNotApplied freezes ovs-vswitchd: the change commits but is not
// applied, which must be an error, and a replay once it runs again succeeds.
func TestRealNotApplied(t *testing.T) {
	e, inst, c := realEnv(t)
	pid := inst.VswitchdPID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	defer cont()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.SetDstPort(ctx, "vxlan0", 4789, 4889)
	if !IsNotApplied(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want not applied (deadline)", err)
	}
	if rb := e.port("vxlan0"); rb != "4889" {
		t.Fatalf("database dst_port = %q, want 4889 committed", rb)
	}
	cont()
	got, err := c.SetDstPort(context.Background(), "vxlan0", 4789, 4889)
	if err != nil || !got.Healthy() {
		t.Fatalf("replay after vswitchd resumed: %s, %v", got, err)
	}
}

// TestRealReconnect: the driver survives ovs-vswitchd restarts (and redials
// when its connection dies).
func TestRealReconnect(t *testing.T) {
	_, inst, c := realEnv(t)
	ctx := context.Background()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inst.RestartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.SetDstPort(ctx, "vxlan0", 4789, 4889)
	if err != nil || !got.Healthy() {
		t.Fatalf("after vswitchd restart: %s, %v", got, err)
	}
	c.mu.Lock()
	_ = c.conn.Close() // as if ovsdb-server dropped us
	c.mu.Unlock()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after connection loss: %v", err)
	}
}
