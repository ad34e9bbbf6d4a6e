package ifaddr_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/ifaddr"
	"github.com/cutover-dev/cutover/pkg/netns"
)

func ip(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := netns.Command(ns, append([]string{"ip"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// In a fresh namespace: a kernel VXLAN device like flannel.1 and a tap like
// the tun0 internal port of a userspace OVS, each with addresses; the reader
// returns their IPv4 addresses, primaries first, and names a missing
// interface as not found.
func TestIPv4OnRealInterfaces(t *testing.T) {
	ns := testenv.Netns(t, "cot-ifaddr")
	ip(t, ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ip(t, ns, "addr", "add", "198.18.0.1/24", "dev", "eth0")
	ip(t, ns, "link", "set", "eth0", "up")
	ip(t, ns, "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", "198.18.0.1", "dev", "eth0", "dstport", "4789", "nolearning")
	ip(t, ns, "addr", "add", "198.19.2.0/32", "dev", "flannel.1")
	ip(t, ns, "link", "set", "flannel.1", "up")
	ip(t, ns, "tuntap", "add", "dev", "tun0", "mode", "tap")
	ip(t, ns, "addr", "add", "198.19.1.1/24", "dev", "tun0")
	ip(t, ns, "addr", "add", "198.19.1.9/24", "dev", "tun0") // same subnet: secondary
	ip(t, ns, "addr", "add", "198.19.5.1/24", "dev", "tun0")
	ip(t, ns, "-6", "addr", "add", "2001:db8::1/64", "dev", "tun0") // not IPv4: left out
	ip(t, ns, "link", "add", "empty0", "type", "veth", "peer", "name", "empty1")

	k, err := ifaddr.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	text := func(name string) string {
		t.Helper()
		addrs, err := k.IPv4(name)
		if err != nil {
			t.Fatal(err)
		}
		var l []string
		for _, a := range addrs {
			s := a.Prefix.String()
			if a.Secondary {
				s += " secondary"
			}
			l = append(l, s)
		}
		return strings.Join(l, ", ")
	}
	for _, tc := range []struct{ name, want string }{
		{"flannel.1", "198.19.2.0/32"},
		{"tun0", "198.19.1.1/24, 198.19.5.1/24, 198.19.1.9/24 secondary"},
		{"empty0", ""},
	} {
		if got := text(tc.name); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	_, err = k.IPv4("vxlan.calico")
	var e *ifaddr.Error
	if !ifaddr.IsNotFound(err) || !errors.As(err, &e) || e.Interface != "vxlan.calico" {
		t.Errorf("missing interface: %v, want a not-found error naming it", err)
	}
}

func TestFake(t *testing.T) {
	f := ifaddr.Fake{"tun0": {{Prefix: netip.MustParsePrefix("198.19.1.1/24")}, {Prefix: netip.MustParsePrefix("2001:db8::1/64")}}, "empty0": nil}
	if got, err := f.IPv4("tun0"); err != nil || len(got) != 1 || got[0].Prefix.String() != "198.19.1.1/24" {
		t.Errorf("IPv4(tun0) = %v, %v", got, err)
	}
	if _, err := f.IPv4("nope0"); !ifaddr.IsNotFound(err) {
		t.Errorf("missing: %v", err)
	}
	if got, want := f.Dump(), "addr tun0 198.19.1.1/24\naddr tun0 2001:db8::1/64\nlink empty0"; got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
}
