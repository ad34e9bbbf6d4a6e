package faults_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
)

// The underlay path check (issue 14) against an NSX-like filter in the
// lab's underlay (nftables on the hub's side of the nodes' links): UDP to
// the new port dropped between two nodes; only VXLAN frames with the
// overlay's VNI dropped; frames above a size dropped. Each: plan and
// cutover name the pairs or the size, exit 4 (preflight), and OVS,
// iptables, flows, state files and the journal are unchanged. A clean
// underlay passes; the port bound on a node is a clear error.
func TestPathCheckOVS(t *testing.T) {
	pathCheckCases(t, newEnv(t, "path"), 0, lab.DefaultPort[lab.BackendOVS])
}

// The same on the kernel VXLAN backend (flannel.1, VNI 1).
func TestPathCheckKernel(t *testing.T) {
	pathCheckCases(t, newEnv(t, "pathk", func(c *lab.Config) { c.Backend = lab.BackendKernelVXLAN }), 1, lab.DefaultPort[lab.BackendKernelVXLAN])
}

func pathCheckCases(t *testing.T, e *env, vni uint32, current int) {
	const port = "4889"
	// Clean: every direction of the 3 nodes passes, at full size.
	r := e.coordctl("-o", "json", "pathcheck", "--port", port)
	var res struct {
		Vnis         []uint32 `json:"vnis"`
		Sizes        []uint32 `json:"sizes"`
		PairsChecked uint32   `json:"pairs_checked"`
		Pairs        []struct {
			Verdict     string `json:"verdict"`
			LargestSize uint32 `json:"largest_size"`
		} `json:"pairs"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); r.code != 0 || err != nil {
		t.Fatalf("clean underlay: exit %d, %v:\n%s", r.code, err, r.out)
	}
	if res.PairsChecked != 6 || len(res.Problems) != 0 || len(res.Vnis) != 1 || res.Vnis[0] != vni || res.Sizes[len(res.Sizes)-1] != 1500 {
		t.Fatalf("clean underlay: %+v", res)
	}
	for _, p := range res.Pairs {
		if p.Verdict != "ok" || p.LargestSize != 1500 {
			t.Errorf("clean underlay: pair %+v", p)
		}
	}
	if r := e.coordctl("plan", "--port", port); r.code != 0 || !strings.Contains(r.out, "6 of 6 direction(s) pass") {
		t.Fatalf("clean plan: exit %d:\n%s", r.code, r.out)
	}

	cases := []struct {
		name   string
		filter lab.UnderlayFilter
		want   []string
	}{
		{"udp/4889 dropped between n1 and n3", lab.UnderlayFilter{Port: 4889, Between: [2]string{"n1", "n3"}},
			[]string{"udp/4889 blocked between 2 node pair(s)", "n1→n3", "n3→n1", "the current port udp/" + itoa(current) + " passes between them"}},
		// The control: with the current port dropped too, the pair says
		// nothing about the new one.
		{"udp/4889 and the current port dropped between n1 and n3", lab.UnderlayFilter{Port: 4889, Between: [2]string{"n1", "n3"}, BetweenAlso: []int{current}},
			[]string{"cannot conclude for 2 node pair(s)", "n1→n3,n3→n1"}},
		{"VXLAN with the overlay's VNI dropped", lab.UnderlayFilter{Port: 4889, VNI: vni, VNISet: true},
			[]string{"overlay's VNI dropped", "n1→n2 (VNI " + itoa(int(vni)) + ")", "n3→n2 (VNI"}},
		{"frames above 1400 bytes dropped", lab.UnderlayFilter{Port: 4889, Above: 1400},
			[]string{"full-size VXLAN frames (1500 bytes, DF) dropped", "n1→n2 (largest passed 1400)"}},
	}
	for _, tc := range cases {
		if err := e.l.FilterUnderlay(e.ctx, tc.filter); err != nil {
			t.Fatal(err)
		}
		before := e.snap()
		for _, cmd := range []string{"plan", "cutover"} {
			if err := refusedNaming(e, cmd, port, tc.want); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			e.assertUnchanged(before)
		}
		rules, _ := e.l.UnderlayFilterRules(e.ctx)
		t.Logf("%s: refused; filter:\n%s", tc.name, rules)
		e.fact("underlay: "+tc.name, "plan, cutover", "refused naming the pairs/size, exit 4, nothing changed", "exit 4, unchanged", 0)
	}
	if err := e.l.ClearUnderlayFilter(e.ctx); err != nil {
		t.Fatal(err)
	}

	// The port bound on n2's underlay address: a clear error, by node
	// and port; the other pair is still judged.
	n2, _ := e.l.Node("n2")
	var held net.PacketConn
	if err := netns.Do(n2.Netns, func() error {
		var err error
		held, err = net.ListenPacket("udp4", netip.AddrPortFrom(n2.UnderlayIP, 4889).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r = e.coordctl("pathcheck", "--port", port)
	_ = held.Close()
	out := strings.Join(strings.Fields(r.out), " ")
	for _, w := range []string{"underlay path check not run on n2", "udp port 4889 on " + n2.UnderlayIP.String() + " is not free", "address already in use"} {
		if r.code != 4 || !strings.Contains(out, w) {
			t.Errorf("port held on n2: exit %d, does not say %q:\n%s", r.code, w, r.out)
		}
	}
	if !strings.Contains(r.out, "2 of 6 direction(s) pass") {
		t.Errorf("port held on n2: n1↔n3 not judged:\n%s", r.out)
	}
	dev := "br0"
	if e.l.OVS("n2") == nil {
		dev = "flannel.1"
	}
	harmlessOnOverlay(t, e, dev, current)
	// And once the filter is gone and the port free, the plan passes.
	if r := e.coordctl("plan", "--port", port); r.code != 0 {
		t.Fatalf("plan after clearing: exit %d:\n%s", r.code, r.out)
	}
}

// refusedNaming is the guard of the cases above: coordctl cmd exits 4
// (preflight) and its output says every one of want.
func refusedNaming(e *env, cmd, port string, want []string) error {
	r := e.coordctl(cmd, "--port", port)
	if r.code != 4 {
		return fmt.Errorf("%s: exit %d, want 4 (preflight):\n%s", cmd, r.code, r.out)
	}
	out := strings.Join(strings.Fields(r.out), " ") // coordctl wraps long lines
	for _, w := range want {
		if !strings.Contains(out, w) {
			return fmt.Errorf("%s does not say %q:\n%s", cmd, w, r.out)
		}
	}
	return nil
}

// TestPathCheckBites is the test of the test (STYLE.md "a safety test
// must bite"): with n1's agent built with the test-only tag
// cutover_faultinject and told to report every frame as passed, the
// blocked n1↔n3 pair goes unseen, and the guard must fail.
func TestPathCheckBites(t *testing.T) {
	t.Setenv("COT_FAULTINJECT_PATH_PASSES", "n1") // agent.FaultInjectPathEnv; // the lab's agents inherit it; only the tagged build reads it
	e := newEnv(t, "pathb", func(c *lab.Config) { c.AgentBin = labtest.FaultInjectAgent(t) })
	if err := e.l.FilterUnderlay(e.ctx, lab.UnderlayFilter{Port: 4889, Between: [2]string{"n1", "n3"}}); err != nil {
		t.Fatal(err)
	}
	err := refusedNaming(e, "plan", "4889", []string{"n1→n3"})
	if err == nil {
		t.Fatal("n1's agent reports frames that never passed, yet the guard saw the blocked pair")
	}
	t.Logf("the guard failed as it must: %v", firstLines(err.Error(), 2))
}

// harmlessOnOverlay sends the check's control frames from n1 to n2's
// current port, where the running overlay takes them (OVS vxlan0, or
// flannel.1): the decapsulated inner frame must show up on n2's overlay
// device (so the overlay did take it: the test has teeth), addressed to
// the MAC nobody owns, and reach no socket (one bound on 0.0.0.0:9, the
// inner frame's UDP port, gets nothing).
func harmlessOnOverlay(t *testing.T, e *env, dev string, current int) {
	n1, _ := e.l.Node("n1")
	n2, _ := e.l.Node("n2")
	var sink *net.UDPConn
	var pfd int
	if err := netns.Do(n2.Netns, func() error {
		var err error
		if sink, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero, Port: 9}); err != nil {
			return err
		}
		pfd, err = packetSocket(dev)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	defer unix.Close(pfd)
	b, err := pathprobe.Frame{Kind: pathprobe.Control, Nonce: pathprobe.Nonce("harmless"), VNI: 0, Size: 256}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if dev == "flannel.1" {
		b[6] = 1 // flannel's VNI 1: the device takes only its own
	}
	if err := netns.Do(n1.Netns, func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: n1.UnderlayIP.AsSlice()}, &net.UDPAddr{IP: n2.UnderlayIP.AsSlice(), Port: current})
		if err != nil {
			return err
		}
		defer c.Close()
		for range 20 {
			if _, err := c.Write(b); err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mac := pathprobe.InnerDstMAC()
	seen := 0
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(pfd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if n >= 14 && [6]byte(buf[:6]) == mac {
			seen++
		}
	}
	if seen == 0 {
		t.Errorf("%s: no decapsulated control frame seen on n2's %s: the overlay did not take them, the test proves nothing", dev, dev)
	}
	_ = sink.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, from, err := sink.ReadFromUDP(buf); err == nil {
		t.Errorf("%s: a socket on n2 got %d bytes from %s: the inner frame was delivered", dev, n, from)
	}
	t.Logf("%s: %d decapsulated control frame(s) seen on n2's %s for %s, delivered to no socket", dev, seen, dev, net.HardwareAddr(mac[:]))
}

// packetSocket is an AF_PACKET socket on dev, every protocol, with the
// link header.
func packetSocket(dev string) (int, error) {
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return 0, err
	}
	proto := int(uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index}); err != nil {
		_ = unix.Close(fd)
		return 0, err
	}
	return fd, nil
}
