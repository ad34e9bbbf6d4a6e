package vxlan

import (
	"errors"
	"net"
	"strings"
	"testing"
)

func labSnapshot() Snapshot {
	return Snapshot{
		Device: Device{Name: "vx0", MTU: 1450, MAC: "02:00:00:00:00:01", TxQLen: 1000, Up: true, VNI: 42, Port: 4789,
			Local: net.ParseIP("198.18.0.1"), TTL: 0, UDPCsum: true},
		Addrs: []Addr{{CIDR: "198.18.100.1/24", Flags: 0x80}},
		FDB: []FDBEntry{
			{MAC: "02:00:00:00:00:02", Dst: net.ParseIP("198.18.0.2"), State: 0x80, Flags: 2},
			{MAC: "00:00:00:00:00:00", Dst: net.ParseIP("198.18.0.2"), State: 0x80, Flags: 2},
		},
		Neighbors: []Neighbor{{IP: net.ParseIP("198.18.100.2"), MAC: "02:00:00:00:00:02", State: 0x80}},
		Routes:    []Route{{Dst: "198.18.101.0/24", Gw: net.ParseIP("198.18.100.2"), Family: 2, Table: 254, Protocol: 3, Type: 1}},
	}
}

const labText = `link vx0 up mtu 1450 address 02:00:00:00:00:01 txqlen 1000 vxlan id 42 dstport 4789 local 198.18.0.1 srcport 0 0 ttl 0 tos 0 ageing 0 maxaddress 0 nolearning udpcsum
addr vx0 198.18.100.1/24 scope 0 flags 0x80
fdb vx0 00:00:00:00:00:00 dst 198.18.0.2 state PERMANENT flags 0x2
fdb vx0 02:00:00:00:00:02 dst 198.18.0.2 state PERMANENT flags 0x2
neigh vx0 198.18.100.2 lladdr 02:00:00:00:00:02 PERMANENT flags 0x0
route 198.18.101.0/24 via 198.18.100.2 dev vx0 table 254 proto 3 scope 0 type 1
`

func TestFakeRecreateAndFDBPorts(t *testing.T) {
	f := NewFake(labSnapshot())
	if got := f.Dump(); got != labText {
		t.Fatalf("dump:\n%s\nwant:\n%s", got, labText)
	}
	snap, err := f.Snapshot("vx0")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetFDBPorts(snap, 4889); err != nil {
		t.Fatal(err)
	}
	s, _ := f.Snapshot("vx0")
	for _, e := range s.FDB {
		if e.Port != 4889 {
			t.Fatalf("fdb port after SetFDBPorts(4889): %s", s.Text())
		}
	}
	if _, err := f.Recreate(s, 4889); err != nil {
		t.Fatal(err)
	}
	// On the device's own port the per-entry port reads back as none.
	want := labSnapshot()
	want.Device.Port = 4889
	if got := f.Dump(); got != want.Text() {
		t.Fatalf("after recreate:\n%s\nwant:\n%s", got, want.Text())
	}
	f.Delete("vx0")
	if _, err := f.Recreate(snap, 4789); err != nil || f.Dump() != labText {
		t.Fatalf("rebuild after loss: %v\n%s", err, f.Dump())
	}
}

func TestFakeErrors(t *testing.T) {
	f := NewFake(labSnapshot())
	f.Others["eth0"] = "veth"
	if _, err := f.Snapshot("nope"); !IsNotFound(err) {
		t.Errorf("missing device: %v", err)
	}
	if _, err := f.Snapshot("eth0"); !IsNotVXLAN(err) {
		t.Errorf("veth: %v", err)
	}
	var e *Error
	if _, err := f.Snapshot("nope"); !errors.As(err, &e) || e.Device != "nope" || e.Op != "snapshot" {
		t.Errorf("error type: %#v", err)
	}
	snap := labSnapshot()
	for _, bad := range []struct {
		mut  func(*Snapshot)
		port int
		want string
	}{
		{func(s *Snapshot) {}, 0, "newPort 0"},
		{func(s *Snapshot) { s.Device.Name = "" }, 4889, "device.name"},
		{func(s *Snapshot) { s.Device.MAC = "zz" }, 4889, "device.mac"},
		{func(s *Snapshot) { s.Device.Port = 0 }, 4889, "device.port 0"},
	} {
		s := clone(snap)
		bad.mut(&s)
		if _, err := f.Recreate(s, bad.port); err == nil || !contains(err.Error(), bad.want) {
			t.Errorf("Recreate: err %v, want it to name %q", err, bad.want)
		}
	}
	boom := errors.New("boom")
	f.FailNext = boom
	if _, err := f.Recreate(snap, 4889); !errors.Is(err, boom) {
		t.Errorf("FailNext: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
