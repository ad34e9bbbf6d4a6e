package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

func pathAgent(t *testing.T, name, addr string) *testAgent {
	cfg := testConfig(t)
	cfg.NodeName, cfg.UnderlayAddress, cfg.Probe = name, addr, false
	return startAgent(t, cfg, newFake())
}

func freeUDPPort(t *testing.T) uint32 {
	t.Helper()
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint32(l.LocalAddr().(*net.UDPAddr).Port)
}

// TestPathCheckPair: two agents on 127.0.0.1 and 127.0.0.2 check each
// other: every VNI and size passes both ways, the metrics count it.
func TestPathCheckPair(t *testing.T) {
	ctx := context.Background()
	a, b := pathAgent(t, "a", "127.0.0.1"), pathAgent(t, "b", "127.0.0.2")
	info, err := a.client.Info(ctx, &agentv1.InfoRequest{})
	if err != nil || info.UnderlayAddress != "127.0.0.1" || len(info.OverlayVnis) != 1 || info.OverlayVnis[0] != 0 {
		t.Fatalf("Info = %v, %v: want underlay 127.0.0.1, VNIs [0]", info, err)
	}
	port := freeUDPPort(t)
	start := time.Now().Add(100 * time.Millisecond).UnixNano()
	req := func(peer, addr string) *agentv1.PathCheckRequest {
		// A common start 100 ms ahead: both windows run together.
		return &agentv1.PathCheckRequest{CheckId: "c1", Port: port, Vnis: []uint32{0, 7}, Sizes: []uint32{200, 1400},
			WindowMillis: 300, IntervalMillis: 50, Peers: []*agentv1.PathPeer{{Name: peer, Address: addr}}, StartUnixNano: start}
	}
	var wg sync.WaitGroup
	var ra, rb *agentv1.PathCheckResponse
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); ra, ea = a.client.PathCheck(ctx, req("b", "127.0.0.2")) }()
	go func() { defer wg.Done(); rb, eb = b.client.PathCheck(ctx, req("a", "127.0.0.1")) }()
	wg.Wait()
	if ea != nil || eb != nil {
		t.Fatal(ea, eb)
	}
	for _, r := range []*agentv1.PathCheckResponse{ra, rb} {
		if len(r.Results) != 4 {
			t.Fatalf("%s: %d results, want 4", r.Node, len(r.Results))
		}
		for _, x := range r.Results {
			if !x.Answered || !x.Received {
				t.Errorf("%s: %v: want answered and received", r.Node, x)
			}
		}
	}
	if v := gathered(t, a.reg, "cutover_agent_path_checks_total", "result", "ok"); v != 1 {
		t.Fatalf("path_checks_total{ok} = %v, want 1", v)
	}
	// The socket is gone when PathCheck returns: the port binds again.
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)})
	if err != nil {
		t.Fatalf("port %d still held after the check: %v", port, err)
	}
	l.Close()
}

// TestPathCheckPortInUse: a bound port is refused, naming node, port and
// the cause; nothing is sent.
func TestPathCheckPortInUse(t *testing.T) {
	a := pathAgent(t, "a", "127.0.0.1")
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := uint32(l.LocalAddr().(*net.UDPAddr).Port)
	_, err = a.client.PathCheck(context.Background(), &agentv1.PathCheckRequest{CheckId: "c", Port: port, Vnis: []uint32{1}, Sizes: []uint32{200}, WindowMillis: 100, IntervalMillis: 50})
	want := []string{"node a", fmt.Sprintf("udp port %d on 127.0.0.1", port), "address already in use"}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err %v: want FailedPrecondition", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("err %v: does not say %q", err, w)
		}
	}
	if v := gathered(t, a.reg, "cutover_agent_path_checks_total", "result", "port_in_use"); v != 1 {
		t.Fatalf("path_checks_total{port_in_use} = %v, want 1", v)
	}
}

func TestPathCheckBadInput(t *testing.T) {
	a := pathAgent(t, "a", "127.0.0.1")
	good := func() *agentv1.PathCheckRequest {
		return &agentv1.PathCheckRequest{CheckId: "c", Port: 4889, Vnis: []uint32{1}, Sizes: []uint32{200}, WindowMillis: 100, IntervalMillis: 50}
	}
	for field, mod := range map[string]func(*agentv1.PathCheckRequest){
		"port":             func(r *agentv1.PathCheckRequest) { r.Port = 70000 },
		"start_unix_nano":  func(r *agentv1.PathCheckRequest) { r.StartUnixNano = time.Now().Add(time.Hour).UnixNano() },
		"control_port":     func(r *agentv1.PathCheckRequest) { r.ControlPort = 70000 },
		"check_id":         func(r *agentv1.PathCheckRequest) { r.CheckId = "" },
		"window_millis":    func(r *agentv1.PathCheckRequest) { r.WindowMillis = 60000 },
		"interval_millis":  func(r *agentv1.PathCheckRequest) { r.IntervalMillis = 0 },
		"vnis":             func(r *agentv1.PathCheckRequest) { r.Vnis = nil },
		"vni 16777216":     func(r *agentv1.PathCheckRequest) { r.Vnis = []uint32{1 << 24} },
		"size 10":          func(r *agentv1.PathCheckRequest) { r.Sizes = []uint32{10} },
		"peers[0].address": func(r *agentv1.PathCheckRequest) { r.Peers = []*agentv1.PathPeer{{Name: "b", Address: "nope"}} },
		"peers[0].name":    func(r *agentv1.PathCheckRequest) { r.Peers = []*agentv1.PathPeer{{Name: "a", Address: "127.0.0.2"}} },
		"listen_for[0].name": func(r *agentv1.PathCheckRequest) {
			r.Peers = []*agentv1.PathPeer{{Name: "b", Address: "127.0.0.2"}}
			r.ListenFor = []*agentv1.PathPeer{{Name: "b", Address: "127.0.0.2"}}
		},
	} {
		r := good()
		mod(r)
		_, err := a.client.PathCheck(context.Background(), r)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err %v: want InvalidArgument naming it", field, err)
		}
	}
}

// TestPathCheckNoUnderlay: an agent that does not know its underlay
// address says so in Info and refuses the check with the flag to set.
func TestPathCheckNoUnderlay(t *testing.T) {
	cfg := testConfig(t)
	cfg.Probe = false
	a := startAgent(t, cfg, newFake()) // --listen :9443: no host
	info, err := a.client.Info(context.Background(), &agentv1.InfoRequest{})
	if err != nil || info.UnderlayAddress != "" || !strings.Contains(info.PathCheckOffReason, "--underlay-address") {
		t.Fatalf("Info = %v, %v", info, err)
	}
	_, err = a.client.PathCheck(context.Background(), &agentv1.PathCheckRequest{CheckId: "c", Port: 4889, Vnis: []uint32{1}, Sizes: []uint32{200}, WindowMillis: 100, IntervalMillis: 50})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--underlay-address") {
		t.Fatalf("err %v", err)
	}
}
