package ovs

import (
	"context"
	"strings"
	"testing"
)

func TestDstPort(t *testing.T) {
	for _, tc := range []struct {
		typ, port string // port "" = option absent
		want      uint16
		err       string
	}{
		{"vxlan", "", 4789, ""},
		{"geneve", "", 6081, ""},
		{"vxlan", "4889", 4889, ""},
		{"vxlan", "65535", 65535, ""},
		{"vxlan", "0", 0, "not a UDP port"},
		{"vxlan", "-5", 0, "not a UDP port"},
		{"vxlan", "70000", 0, "not a UDP port"},
		{"vxlan", "abc", 0, "not a UDP port"},
		{"internal", "", 0, "no default"},
	} {
		i := Interface{Name: "x", Type: tc.typ, Options: map[string]string{}}
		if tc.port != "" {
			i.Options["dst_port"] = tc.port
		}
		got, err := i.DstPort()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s dst_port=%q: err %v, want %q", tc.typ, tc.port, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s dst_port=%q = %d, %v; want %d", tc.typ, tc.port, got, err, tc.want)
		}
	}
}

func TestPlanDstPort(t *testing.T) {
	vx := func(opts ...string) Interface {
		i := Interface{Name: "vxlan0", Type: "vxlan", Options: map[string]string{"key": "flow"}, OFPort: 1}
		for n := 0; n+1 < len(opts); n += 2 {
			i.Options[opts[n]] = opts[n+1]
		}
		return i
	}
	for _, tc := range []struct {
		name     string
		cur      Interface
		from, to uint16
		noop     bool
		wantOpts string
		err      func(error) bool
	}{
		{"absent means 4789", vx(), 4789, 4889, false, "{dst_port=4889, key=flow}", nil},
		{"explicit", vx("dst_port", "4889"), 4889, 4789, false, "{dst_port=4789, key=flow}", nil},
		{"replay", vx("dst_port", "4889"), 4789, 4889, true, "", nil},
		{"from==to", vx(), 4789, 4789, true, "", nil},
		{"back to default via absent", vx(), 4889, 4789, true, "", nil},
		{"conflict", vx("dst_port", "4999"), 4789, 4889, false, "", IsConflict},
		{"garbage port is a conflict", vx("dst_port", "-5"), 4789, 4889, false, "", IsConflict},
		{"from 0", vx(), 0, 4889, false, "", func(err error) bool { return strings.Contains(err.Error(), "from=0") }},
		{"to 0", vx(), 4789, 0, false, "", func(err error) bool { return strings.Contains(err.Error(), "to=0") }},
		{"not a tunnel", Interface{Name: "br0", Type: "internal"}, 4789, 4889, false, "", func(err error) bool { return strings.Contains(err.Error(), `"internal"`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, noop, err := planDstPort(tc.cur, tc.from, tc.to)
			if tc.err != nil {
				if err == nil || !tc.err(err) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil || noop != tc.noop {
				t.Fatalf("noop %v err %v, want noop %v", noop, err, tc.noop)
			}
			if !noop && optionsString(opts) != tc.wantOpts {
				t.Fatalf("options %s, want %s", optionsString(opts), tc.wantOpts)
			}
			if tc.cur.Options["key"] != "flow" && tc.cur.Type == "vxlan" {
				t.Fatal("input options mutated")
			}
		})
	}
}

func TestFakeDump(t *testing.T) {
	f := NewFake(
		Interface{Name: "vxlan0", Type: "vxlan", Options: map[string]string{"remote_ip": "flow", "key": "flow"}},
		Interface{Name: "br0", Type: "internal", OFPort: 65534},
	)
	ctx := context.Background()
	if _, err := f.SetDstPort(ctx, "vxlan0", 4789, 4889); err != nil {
		t.Fatal(err)
	}
	f.FailPort("vxlan0", "boom")
	_, err := f.SetDstPort(ctx, "vxlan0", 4889, 4789)
	if !IsPortError(err) {
		t.Fatalf("err = %v, want port error", err)
	}
	want := "br0 type=internal ofport=65534\n" +
		`vxlan0 type=vxlan ofport=-1 options:dst_port=4789 options:key=flow options:remote_ip=flow error="boom"` + "\n"
	if got := f.Dump(); got != want {
		t.Fatalf("dump:\n%s\nwant:\n%s", got, want)
	}
	f.Unreachable(true)
	if err := f.Ping(ctx); err == nil {
		t.Fatal("Ping on unreachable fake succeeded")
	}
}
