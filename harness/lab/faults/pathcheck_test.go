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

// The underlay path check (docs/pathcheck.md) against an NSX-like filter in the
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
		{"udp/4889 dropped between n1 and n3", lab.UnderlayFilter{Port: 4889, Between: [2]string{"n1", "n3"}}, blockedWant("n1", "n3", current)},
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

// blockedWant is what a refusal of udp/4889 blocked in the underlay
// between a and b must say: both directions, and that the current port
// passes between them (the control), so it is the underlay's.
func blockedWant(a, b string, current int) []string {
	return []string{"udp/4889 blocked between 2 node pair(s)", a + "→" + b, b + "→" + a, "the current port udp/" + itoa(current) + " passes between them",
		"open udp/4889 between these nodes in the underlay"}
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
// must bite"), with agents built with the test-only tag
// cutover_faultinject, and asserts why the guard fails, not only that it
// does:
//   - n1's agent reports every frame as passed: the blocked n1↔n3 pair
//     goes unseen, so the plan passes (exit 0) where the guard wants 4;
//   - n3's agent reports every peer's frame as seen arriving on its
//     interfaces (a capture that sees what never came): n2→n3, blocked in
//     the underlay, is taken for n3's own firewall, so the refusal names
//     one pair where the guard wants both, and the plan says so.
func TestPathCheckBites(t *testing.T) {
	t.Setenv("COT_FAULTINJECT_PATH_PASSES", "n1") // agent.FaultInjectPathEnv; the lab's agents inherit it; only the tagged build reads it
	t.Setenv("COT_FAULTINJECT_PATH_WIRE", "n3")   // agent.FaultInjectPathWireEnv
	e := newEnv(t, "pathb", func(c *lab.Config) { c.AgentBin = labtest.FaultInjectAgent(t) })
	current := lab.DefaultPort[lab.BackendOVS]
	if err := e.l.FilterUnderlay(e.ctx, lab.UnderlayFilter{Port: 4889, Between: [2]string{"n1", "n3"}}); err != nil {
		t.Fatal(err)
	}
	err := refusedNaming(e, "plan", "4889", blockedWant("n1", "n3", current))
	if err == nil {
		t.Fatal("n1's agent reports frames that never passed, yet the guard saw the blocked pair")
	}
	if !strings.Contains(err.Error(), "plan: exit 0, want 4") || !strings.Contains(err.Error(), "6 of 6 direction(s) pass") {
		t.Fatalf("the guard failed, but not because the blocked pair went unseen: %v", err)
	}
	t.Logf("the guard failed as it must (a check that does not check): %v", firstLines(err.Error(), 2))

	if err := e.l.FilterUnderlay(e.ctx, lab.UnderlayFilter{Port: 4889, Between: [2]string{"n2", "n3"}}); err != nil {
		t.Fatal(err)
	}
	err = refusedNaming(e, "plan", "4889", blockedWant("n2", "n3", current))
	if err == nil {
		t.Fatal("n3's capture reports frames that never came, yet the guard saw both blocked directions")
	}
	out := strings.Join(strings.Fields(err.Error()), " ")
	for _, w := range []string{`does not say "udp/4889 blocked between 2 node pair(s)"`, "udp/4889 blocked between 1 node pair(s), nothing passed: n3→n2",
		"udp/4889 reaches n3, but n3's own firewall drops it", "n2→n3"} {
		if !strings.Contains(out, w) {
			t.Fatalf("the guard failed, but not because n2→n3 was taken for n3's firewall (want %q): %v", w, err)
		}
	}
	t.Logf("the guard failed as it must (an underlay block taken for the node's firewall): %v", firstLines(err.Error(), 2))
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

// TestPathCheckStatelessFirewall: n2's own INPUT
// chain rejects UDP from the underlay with no conntrack ESTABLISHED rule
// before it (a stateless firewall), and nothing in the underlay drops
// anything. The frames to udp/4889 cross the underlay and reach n2's
// interface; n2's own firewall drops them before any socket, which is what
// Prepare's opening is for. The path check must say so, not blame the
// underlay, and the cutover must go: plan exit 0 naming n2's firewall and
// the directions, cutover exit 0 with every node on 4889.
func TestPathCheckStatelessFirewall(t *testing.T) {
	statelessFirewall(t, newEnv(t, "pfw"), [][]string{
		{"iptables", "-t", "filter", "-A", "INPUT", "-i", "br-ul", "-p", "udp", "-j", "REJECT"},
	}, fromPort)
}

// The same on the kernel VXLAN backend, where the overlay's own frames
// cross netfilter too: the lab's INPUT already drops UDP on eth0 past the
// accepted ports, so removing the ESTABLISHED rule makes it stateless.
// After the cutover the overlay runs on 4889 through the rule Prepare
// added: the proof that Prepare's opening is what the node needed.
func TestPathCheckStatelessFirewallKernel(t *testing.T) {
	statelessFirewall(t, newEnv(t, "pfwk", func(c *lab.Config) { c.Backend = lab.BackendKernelVXLAN }), nil, lab.DefaultPort[lab.BackendKernelVXLAN])
}

func statelessFirewall(t *testing.T, e *env, extra [][]string, current int) {
	for _, argv := range append([][]string{
		{"iptables", "-t", "filter", "-D", "INPUT", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	}, extra...) {
		if out, err := e.l.Exec(e.ctx, "n2", argv...); err != nil {
			t.Fatalf("n2: %v: %v\n%s", argv, err, out)
		}
	}
	t.Logf("n2's filter table:\n%s", e.iptables("n2"))
	e.base = e.snap()
	r := e.coordctl("plan", "--port", "4889")
	out := strings.Join(strings.Fields(r.out), " ")
	if r.code != 0 {
		t.Fatalf("plan: exit %d, want 0: n2's own firewall is no reason to refuse:\n%s", r.code, r.out)
	}
	for _, w := range []string{"n2's own firewall drops it", "n1→n2", "n3→n2", "Prepare opens udp/4889"} {
		if !strings.Contains(out, w) {
			t.Errorf("plan does not say %q:\n%s", w, r.out)
		}
	}
	if strings.Contains(out, "blocked between") || strings.Contains(out, "between these nodes in the underlay") {
		t.Errorf("plan blames the underlay:\n%s", r.out)
	}
	t.Logf("plan:\n%s", r.out)
	r = e.coordctl("cutover", "--port", "4889")
	if r.code != 0 {
		t.Fatalf("cutover: exit %d, want 0:\n%s", r.code, r.out)
	}
	if out := strings.Join(strings.Fields(r.out), " "); !strings.Contains(out, "n2's own firewall drops it") {
		t.Errorf("cutover does not say what the path check found:\n%s", r.out)
	}
	t.Logf("cutover:\n%s", r.out)
	for _, prob := range cleanProblems(e.base, e.snap(), current, 4889) {
		t.Error(prob)
	}
	e.fact("n2's INPUT rejects UDP, no ESTABLISHED rule (stateless)", "plan, cutover", "not refused; n2's firewall named, not the underlay", "exit 0, every node on 4889", 0)
}

// TestPathCheckSharedMTU: every node's pod interface
// (br0) at MTU 1500 on a 1500-byte underlay, so full-size VXLAN frames
// (1550 bytes) pass on neither port. The new port is no worse than the
// current one: plan exit 0 with a warning naming the MTU and the current
// port, and the cutover goes, flagged (exit 7: SUCCEEDED with warnings),
// every node on 4889.
func TestPathCheckSharedMTU(t *testing.T) {
	e := newEnv(t, "pmtu")
	for _, n := range nodes {
		if _, err := e.l.OVS(n).Vsctl(e.ctx, "set", "interface", "br0", "mtu_request=1500"); err != nil {
			t.Fatal(err)
		}
		if out, err := e.l.Exec(e.ctx, n, "ip", "link", "set", "br0", "mtu", "1500"); err != nil {
			t.Fatalf("%s: %v\n%s", n, err, out)
		}
	}
	e.base = e.snap()
	want := []string{"full-size VXLAN frames (1550 bytes, DF)", "the current port udp/4789 drops them too", "n1→n2"}
	r := e.coordctl("plan", "--port", "4889")
	out := strings.Join(strings.Fields(r.out), " ")
	if r.code != 0 {
		t.Fatalf("plan: exit %d, want 0: an MTU problem both ports share is no reason to refuse:\n%s", r.code, r.out)
	}
	for _, w := range append(want, "warning") {
		if !strings.Contains(out, w) {
			t.Errorf("plan does not say %q:\n%s", w, r.out)
		}
	}
	t.Logf("plan:\n%s", r.out)
	r = e.coordctl("cutover", "--port", "4889")
	out = strings.Join(strings.Fields(r.out), " ")
	if r.code != 7 {
		t.Fatalf("cutover: exit %d, want 7 (SUCCEEDED with the shared MTU as a warning):\n%s", r.code, r.out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("cutover does not say %q:\n%s", w, r.out)
		}
	}
	e.assertClean(4889)
	e.fact("pod MTU 1500 on a 1500 underlay (both ports)", "plan, cutover", "not refused; the shared MTU a warning", "plan exit 0, cutover exit 7, every node on 4889", 0)
}
