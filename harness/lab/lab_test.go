package lab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{}.Default()
	if err := ok.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if ok.Dir != "/run/cutover-lab/lab" || ok.Nodes != 8 || ok.Port != 4789 {
		t.Fatalf("defaults: %+v", ok)
	}
	if k := (Config{Backend: BackendKernelVXLAN}).Default(); k.Port != 8472 {
		t.Fatalf("kernel-vxlan default port %d, want flannel's 8472", k.Port)
	}
	for _, tc := range []struct {
		mut   func(*Config)
		field string
	}{
		{func(c *Config) { c.Name = "a-b" }, "Name"},
		{func(c *Config) { c.Name = "UPPER" }, "Name"},
		{func(c *Config) { c.Name = "abcdefghijklm" }, "Name"},
		{func(c *Config) { c.Nodes = 65 }, "Nodes"},
		{func(c *Config) { c.Nodes = -1 }, "Nodes"},
		{func(c *Config) { c.Backend = "geneve" }, "Backend"},
		{func(c *Config) { c.Port = 70000 }, "Port"},
		{func(c *Config) { c.Dir = "/" }, "Dir"},
		{func(c *Config) { c.Dir = "/" + strings.Repeat("x", 90) }, "Dir"},
		{func(c *Config) { c.Parallel = -1 }, "Parallel"},
		{func(c *Config) { c.DefaultStrategy = "staged" }, "DefaultStrategy"},
	} {
		c := ok
		tc.mut(&c)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: got %v, want a ConfigError on %s", c, err, tc.field)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	n := newNode("x", "/run/cutover-lab/x", 7, BackendOVS)
	got := strings.Join([]string{n.Netns, n.UnderlayIP.String(), n.MgmtIP.String(), n.OverlayIP.String(), n.Subnet.String(), n.AgentAddr, n.OVSDBSock}, " ")
	want := "cot-lab-x-n7 198.18.0.17 198.18.128.17 198.19.7.1 198.19.7.0/24 198.18.128.17:9443 /run/cutover-lab/x/n7/ovs/db.sock"
	if got != want {
		t.Fatalf("node 7:\n got %s\nwant %s", got, want)
	}
	last := newNode("x", "/d", MaxNodes, BackendOVS)
	for _, p := range []struct {
		name string
		ok   bool
	}{{last.UnderlayIP.String(), UnderlayNet.Contains(last.UnderlayIP)}, {last.MgmtIP.String(), MgmtNet.Contains(last.MgmtIP)}, {last.OverlayIP.String(), OverlayNet.Contains(last.OverlayIP)}} {
		if !p.ok {
			t.Errorf("node %d address %s outside its network", MaxNodes, p.name)
		}
	}
	for ns, want := range map[string]bool{"cot-lab-x-hub": true, "cot-lab-x-n12": true, "cot-lab-x-b-n1": false, "cot-lab-x-": false, "cot-lab-xy-n1": false} {
		if isLabNetns("x", ns) != want {
			t.Errorf("isLabNetns(x, %s) = %t, want %t", ns, !want, want)
		}
	}
}

func TestBr0Flows(t *testing.T) {
	var nodes []Node
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, newNode("x", "/d", i, BackendOVS))
	}
	got := strings.Join(Br0Flows(nodes[1], nodes), "\n")
	want := `table=0,priority=100,in_port=1,actions=LOCAL
table=0,priority=100,ip,nw_dst=198.19.1.0/24,actions=set_field:198.18.0.11->tun_dst,output:1
table=0,priority=100,arp,arp_tpa=198.19.1.0/24,actions=set_field:198.18.0.11->tun_dst,output:1
table=0,priority=100,ip,nw_dst=198.19.3.0/24,actions=set_field:198.18.0.13->tun_dst,output:1
table=0,priority=100,arp,arp_tpa=198.19.3.0/24,actions=set_field:198.18.0.13->tun_dst,output:1
table=0,priority=0,actions=drop`
	if got != want {
		t.Fatalf("br0 flows of n2:\n%s\nwant:\n%s", got, want)
	}
}

func TestKernelLines(t *testing.T) {
	var nodes []Node
	for i := 1; i <= 2; i++ {
		nodes = append(nodes, newNode("x", "/d", i, BackendKernelVXLAN))
	}
	got := strings.Join(append(kernelVXLANLines(nodes[0], nodes, 4889, false), kernelFDBLines(nodes[0], nodes)...), "\n")
	want := `link del flannel.1
link add flannel.1 address 02:c0:de:03:00:01 type vxlan id 1 local 198.18.0.11 dev eth0 dstport 4889 nolearning
link set flannel.1 mtu 1450
addr add 198.19.1.0/32 dev flannel.1
link set flannel.1 up
neigh replace 198.19.2.0 lladdr 02:c0:de:03:00:02 dev flannel.1 nud permanent
route replace 198.19.2.0/24 via 198.19.2.0 dev flannel.1 onlink
fdb replace 02:c0:de:03:00:02 dev flannel.1 dst 198.18.0.12 self permanent`
	if got != want {
		t.Fatalf("port change on n1:\n%s\nwant:\n%s", got, want)
	}
}

func TestParseOVSPort(t *testing.T) {
	for in, want := range map[string]int{
		`{dst_port="4889", key=flow, remote_ip=flow}`: 4889,
		`{key=flow, remote_ip=flow}`:                  4789,
	} {
		if got, err := parseOVSPort(in); err != nil || got != want {
			t.Errorf("parseOVSPort(%s) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestGARP(t *testing.T) {
	g := garp(newNode("x", "/d", 2, BackendOVS))
	// 14 bytes Ethernet + 28 bytes ARP; sender and target both 198.18.0.12.
	if len(g) != 2*42 || strings.Count(g, "c612000c") != 2 || !strings.HasPrefix(g, "ffffffffffff02c0de020002") {
		t.Fatalf("garp = %s", g)
	}
}

func TestMeshString(t *testing.T) {
	m := Mesh{Nodes: []string{"n1", "n2"}, OK: [][]bool{{false, true}, {false, false}}}
	if got, want := m.String(), "n1 -> n2 ok\nn2 -> n1 FAIL\n"; got != want || m.AllOK() {
		t.Fatalf("mesh text %q (AllOK %t), want %q", got, m.AllOK(), want)
	}
	if icmpChecksum(echoRequest(1, 1)) != 0 {
		t.Fatal("echo request checksum does not verify")
	}
}

func TestCheckNeighbours(t *testing.T) {
	limit := func(n int) func() (int, error) { return func() (int, error) { return n, nil } }
	for _, tc := range []struct {
		nodes, limit int
		ok           bool
	}{
		{32, 1024, true}, // 992: the largest lab a default kernel holds
		{33, 1024, false},
		{64, 1024, false},
		{64, 4032, true},
		{64, 16384, true},
		{1, 0, true},
	} {
		err := checkNeighbours(tc.nodes, limit(tc.limit))
		var ce *ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%d nodes, gc_thresh3 %d: %v, want accepted", tc.nodes, tc.limit, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "Nodes" || ce.Value != strconv.Itoa(tc.nodes) ||
			!strings.Contains(ce.Reason, "gc_thresh3") || !strings.Contains(ce.Reason, strconv.Itoa(tc.limit))):
			t.Errorf("%d nodes, gc_thresh3 %d: %v, want a ConfigError on Nodes naming the sysctl and its value", tc.nodes, tc.limit, err)
		}
	}
	if err := checkNeighbours(64, func() (int, error) { return 0, os.ErrNotExist }); err != nil {
		t.Errorf("unreadable gc_thresh3: %v, want the check skipped", err)
	}
}

// TestUpRefusesPastNeighbourTable: Up reads this kernel's limit and refuses
// a lab that would overflow it before it makes anything.
func TestUpRefusesPastNeighbourTable(t *testing.T) {
	limit, err := readNeighThresh3()
	if err != nil {
		t.Skipf("%s: %v: no limit to check against", NeighThresh3, err)
	}
	if neighNeed(MaxNodes) <= limit {
		t.Skipf("gc_thresh3 is %d here: a %d-node lab fits (CI's fresh machine has the default 1024)", limit, MaxNodes)
	}
	dir := filepath.Join(t.TempDir(), "lab")
	// Cancelled: without the check, Up fails at its first command and
	// tears down rather than building 64 nodes.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l, err := Up(ctx, Config{Name: "nbrtest", Nodes: MaxNodes, Dir: dir})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Nodes" {
		if l != nil {
			_ = l.Down(context.Background())
		}
		t.Fatalf("Up of %d nodes with gc_thresh3 %d: %v, want a ConfigError on Nodes", MaxNodes, limit, err)
	}
	t.Logf("%v", err)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lab dir %s: %v, want nothing made", dir, err)
	}
}
