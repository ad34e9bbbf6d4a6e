package lab

import (
	"strings"
	"testing"
)

// The monitors' lines below are what nft 1.0, iproute2 6.x and
// ovsdb-client 3.1 print (captured in a namespace); the tests replay them
// in order, as the monitors would push them.

const (
	i2Open     = "insert rule ip filter OS_FIREWALL_ALLOW meta l4proto udp ct state new udp dport 4889 counter packets 0 bytes 0 accept # handle 7"
	i2Close    = "delete rule ip filter OS_FIREWALL_ALLOW handle 7"
	i2OpenOld  = "insert rule ip filter OS_FIREWALL_ALLOW meta l4proto udp ct state new udp dport 8472 counter packets 0 bytes 0 accept # handle 3"
	vxlanTail  = " mtu 1450 qdisc noqueue state UNKNOWN group default \\    link/ether 0a:58:c6:12:00:0b brd ff:ff:ff:ff:ff:ff promiscuity 0 \\    vxlan id 1 local 198.18.0.11 dev eth0 srcport 0 0 dstport "
	vxlanTail2 = " nolearning ttl auto ageing 300 udpcsum noudp6zerocsumtx noudp6zerocsumrx"
)

func link(index, name, flags string, port string) string {
	return index + ": " + name + ": <" + flags + ">" + vxlanTail + port + vxlanTail2
}

type i2Line struct {
	node, monitor, line string
}

func replayI2(o *I2Observer, lines []i2Line) {
	for _, l := range lines {
		switch l.monitor {
		case "nft":
			o.nftLine(l.node, l.line)
		case "link":
			o.linkLine(l.node, l.line)
		case "fdb":
			o.fdbLine(l.node, l.line)
		case "ovsdb":
			o.ovsdbLine(l.node, l.line)
		}
	}
}

// kernelAtomic is one node's atomic kernel change: the port opened, the
// device prebuilt down on 4889 under its temporary name (not listening,
// not sending), then the old device renamed away and the twin renamed to
// flannel.1 and up in one request: the flip.
func kernelAtomic(node string) (open, prebuild, flip []i2Line) {
	return []i2Line{{node, "nft", i2Open}},
		[]i2Line{{node, "link", link("9", "cotx1c2d3e4f", "BROADCAST,MULTICAST", "4889")}},
		[]i2Line{
			{node, "link", link("5", "cotd1c2d3e4f", "BROADCAST,MULTICAST,UP,LOWER_UP", "8472")},
			{node, "link", link("9", "flannel.1", "BROADCAST,MULTICAST,UP,LOWER_UP", "4889")},
		}
}

func startKernel(o *I2Observer, nodes ...string) {
	for _, n := range nodes {
		replayI2(o, []i2Line{
			{n, "nft", "add rule ip filter OS_FIREWALL_ALLOW " + strings.TrimPrefix(i2OpenOld, "insert rule ip filter OS_FIREWALL_ALLOW ")},
			{n, "link", link("5", "flannel.1", "BROADCAST,MULTICAST,UP,LOWER_UP", "8472")},
			{n, "fdb", "0a:58:c6:12:00:0c dev flannel.1 dst 198.18.0.12 self permanent"},
		})
	}
}

func TestI2ObserverKernelAtomic(t *testing.T) {
	o1, p1, f1 := kernelAtomic("n1")
	o2, p2, f2 := kernelAtomic("n2")
	cat := func(ls ...[]i2Line) []i2Line {
		var out []i2Line
		for _, l := range ls {
			out = append(out, l...)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		lines []i2Line
		rules I2Rules
		want  string // "" passes
	}{
		{"barrier held", cat(o1, p1, o2, p2, f2, f1), I2Rules{}, ""},
		{"prebuilt device is no flip", cat(o1, p1, p2), I2Rules{Partial: true}, ""},
		{"nothing flipped, partial", cat(o1, o2), I2Rules{Partial: true}, ""},
		{"nothing flipped, full", cat(o1, o2), I2Rules{}, "n1: never seen flipping to 4889"},
		{"flip before a peer opened", cat(o1, p1, f1, o2, p2, f2), I2Rules{}, "I2 violated: n1 flipped to 4889 while n2 had not opened it"},
		{"flip after a peer closed", cat(o1, o2, []i2Line{{"n2", "nft", i2Close}}, f1), I2Rules{Partial: true}, "I2 violated: n1 flipped to 4889 while n2 had not opened it"},
		{"reopened before the flip", cat(o1, o2, []i2Line{{"n2", "nft", i2Close}}, o2, f1), I2Rules{Partial: true}, ""},
		{"rollback then a flip again finds a peer closed", cat(o1, o2, f1, f2,
			[]i2Line{{"n1", "link", link("9", "cotx1c2d3e4f", "BROADCAST,MULTICAST", "4889")}, {"n1", "link", link("5", "flannel.1", "BROADCAST,MULTICAST,UP,LOWER_UP", "8472")}, {"n1", "nft", i2Close}},
			[]i2Line{{"n2", "link", link("12", "flannel.1", "BROADCAST,MULTICAST,UP,LOWER_UP", "4889")}}), I2Rules{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newI2Observer(4889, BackendKernelVXLAN, []string{"n1", "n2"})
			startKernel(o, "n1", "n2")
			replayI2(o, tc.lines)
			err := o.CheckWith(tc.rules)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want a pass, got %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("want %q, got a pass; events %v", tc.want, o.Events())
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
}

// TestI2ObserverKernelStaged: the staged change listens early (the twin up
// on 4889), switches its sending through the FDB remotes' per-entry port,
// and retires (the twin becomes flannel.1); only the switch is a flip,
// and it must find every node listening.
func TestI2ObserverKernelStaged(t *testing.T) {
	listen := func(n string) []i2Line {
		return []i2Line{{n, "nft", i2Open}, {n, "link", link("9", "cotx1c2d3e4f", "BROADCAST,MULTICAST,UP,LOWER_UP", "4889")}}
	}
	switchSend := func(n string) []i2Line {
		return []i2Line{{n, "fdb", "0a:58:c6:12:00:0c dev flannel.1 dst 198.18.0.12 port 4889 self permanent"}}
	}
	retire := func(n string) []i2Line {
		return []i2Line{
			{n, "link", link("5", "cotd1c2d3e4f", "BROADCAST,MULTICAST,UP,LOWER_UP", "8472")},
			{n, "link", link("9", "flannel.1", "BROADCAST,MULTICAST,UP,LOWER_UP", "4889")},
			{n, "link", "Deleted " + link("5", "cotd1c2d3e4f", "BROADCAST,MULTICAST", "8472")},
		}
	}
	var ok []i2Line
	for _, part := range [][]i2Line{listen("n1"), listen("n2"), switchSend("n1"), switchSend("n2"), retire("n1"), retire("n2")} {
		ok = append(ok, part...)
	}
	o := newI2Observer(4889, BackendKernelVXLAN, []string{"n1", "n2"})
	startKernel(o, "n1", "n2")
	replayI2(o, ok)
	if err := o.CheckWith(I2Rules{Staged: true}); err != nil {
		t.Fatalf("a staged change in order: %v", err)
	}
	flips := 0
	for _, e := range o.Events() {
		if e.Kind == "flip" {
			flips++
		}
		if e.Kind == "unflip" {
			t.Errorf("the retirement read as an unflip: %+v", e)
		}
	}
	if flips != 2 {
		t.Errorf("%d flips, want 2 (the switches; the retirement is none): %v", flips, o.Events())
	}

	// n2 opened its firewall but has no receiver yet when n1 switches.
	o = newI2Observer(4889, BackendKernelVXLAN, []string{"n1", "n2"})
	startKernel(o, "n1", "n2")
	replayI2(o, listen("n1"))
	replayI2(o, []i2Line{{"n2", "nft", i2Open}})
	replayI2(o, switchSend("n1"))
	err := o.CheckWith(I2Rules{Staged: true, Partial: true})
	if err == nil || !strings.Contains(err.Error(), "I2 violated: n1 switched sending to 4889 while n2 was not listening on it") {
		t.Fatalf("n1 switched before n2 listened: %v", err)
	}
	if err := o.CheckWith(I2Rules{Partial: true}); err != nil {
		t.Errorf("the atomic rule asks only for the firewall: %v", err)
	}
	// Switching back is no flip, and a sender on the old port again.
	replayI2(o, []i2Line{{"n1", "fdb", "0a:58:c6:12:00:0c dev flannel.1 dst 198.18.0.12 self permanent"}})
	if ev := o.Events(); ev[len(ev)-1].Kind != "unflip" {
		t.Errorf("switching back: last event %+v, want an unflip", ev[len(ev)-1])
	}
}

// TestI2ObserverOVS: vxlan0 on the port is the flip; a receive port on it
// (staged) only listens.
func TestI2ObserverOVS(t *testing.T) {
	o := newI2Observer(4889, BackendOVS, []string{"n1", "n2"})
	replayI2(o, []i2Line{
		{"n1", "ovsdb", `0b6f,initial,vxlan0,"{dst_port=""4789"", key=flow, remote_ip=flow}"`},
		{"n2", "ovsdb", `1c7e,initial,vxlan0,"{dst_port=""4789"", key=flow, remote_ip=flow}"`},
		{"n1", "nft", i2Open},
		{"n1", "ovsdb", `2d8f,insert,cotrx0,"{dst_port=""4889"", key=flow, local_ip=""198.18.0.11"", remote_ip=flow}"`},
		{"n1", "ovsdb", `0b6f,old,,"{dst_port=""4789"", key=flow, remote_ip=flow}"`},
		{"n1", "ovsdb", `0b6f,new,vxlan0,"{dst_port=""4889"", key=flow, remote_ip=flow}"`},
		{"n2", "nft", i2Open},
	})
	err := o.CheckWith(I2Rules{Partial: true})
	if err == nil || !strings.Contains(err.Error(), "I2 violated: n1 flipped to 4889 while n2 had not opened it") {
		t.Fatalf("n1 flipped before n2 opened: %v", err)
	}
	if got := o.Flipped(); len(got) != 1 || got[0] != "n1" {
		t.Errorf("flipped %v, want [n1] (the receive port is no flip)", got)
	}
}
