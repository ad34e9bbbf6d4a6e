package dataplane_test

// Privileged: the firewall opening takes effect on a host whose INPUT ends
// in a catch-all REJECT (RHEL's and firewalld's default), both with the
// port's rule in INPUT itself and in a chain the agent creates. UDP to the
// new port must pass after Open and not before, and be refused again after
// Close. Real iptables in two fresh namespaces joined by a veth pair.

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/nsiptables"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
)

const (
	addrA = "198.18.77.1"
	addrB = "198.18.77.2"
)

// rejectingPair makes namespaces a and b joined by a veth pair; a's INPUT
// accepts established traffic and rejects everything else at its end.
func rejectingPair(t *testing.T) (a, b string) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "iptables", "iptables-save")
	a, b = testenv.Netns(t, "cot-fw"), testenv.Netns(t, "cot-fw")
	veth := fmt.Sprintf("cotfw%d", time.Now().UnixNano()%100000)
	vxlantest.Run(t, a, "ip link add "+veth+" type veth peer name eth0 netns "+b)
	vxlantest.Run(t, a, "ip link set "+veth+" name eth0")
	vxlantest.Run(t, a, "ip addr add "+addrA+"/24 dev eth0")
	vxlantest.Run(t, b, "ip addr add "+addrB+"/24 dev eth0")
	vxlantest.Run(t, a, "ip link set eth0 up")
	vxlantest.Run(t, b, "ip link set eth0 up")
	vxlantest.Run(t, a, "iptables -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT")
	vxlantest.Run(t, a, "iptables -A INPUT -j REJECT --reject-with icmp-port-unreachable")
	return a, b
}

// passes reports whether a UDP datagram from b reaches a listener on
// a:port within a short wait (several tries: the first may race ARP).
func passes(t *testing.T, a, b string, port int) bool {
	t.Helper()
	var conn *net.UDPConn
	if err := netns.Do(a, func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(addrA), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan bool, 1)
	go func() {
		buf := make([]byte, 64)
		_ = conn.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		n, _, err := conn.ReadFromUDP(buf)
		got <- err == nil && strings.HasPrefix(string(buf[:n]), "cutover")
	}()
	if err := netns.Do(b, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addrA), Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		for range 5 {
			_, _ = c.Write([]byte("cutover probe"))
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return <-got
}

func TestFirewallOpensPastACatchAllReject(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chain  string
		create bool
	}{
		{"rule in INPUT", "INPUT", false},
		{"rule in a created chain", "OS_FIREWALL_ALLOW", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := rejectingPair(t)
			var ipt *iptables.Client
			if err := netns.Do(a, func() error {
				var err error
				ipt, err = iptables.New(t.Context(), iptables.Config{})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			fw := &dataplane.Firewall{IPT: nsiptables.IPT{NS: a, C: ipt}, CreateChain: tc.create, JumpFrom: "INPUT",
				Templates: []iptables.Rule{{Table: "filter", Chain: tc.chain, Proto: "udp", StateNew: true, Target: "ACCEPT"}}}
			if passes(t, a, b, 4889) {
				t.Fatal("UDP 4889 passes before Open: the REJECT baseline does not hold, the test proves nothing")
			}
			if err := fw.Open(4889); err != nil {
				t.Fatal(err)
			}
			if !passes(t, a, b, 4889) {
				t.Fatalf("UDP 4889 refused after Open; INPUT:\n%s", vxlantest.Run(t, a, "iptables -S INPUT"))
			}
			if err := fw.Close(4889, nil); err != nil {
				t.Fatal(err)
			}
			if passes(t, a, b, 4889) {
				t.Fatal("UDP 4889 still passes after Close")
			}
		})
	}
}
