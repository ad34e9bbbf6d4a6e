package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// The underlay path check's side of the AgentService (docs/pathcheck.md): before
// anything changes, the coordinator has every agent bind the target port
// on its underlay address and exchange real VXLAN frames with its peers.
// It touches neither OVS nor the tunnel device: one UDP socket on a port
// nothing uses yet, closed before PathCheck returns.

// Bounds of a PathCheck request: a check holds a socket and a goroutine
// for its window, and every preflight runs one.
const (
	maxPathWindow = 10 * time.Second
	maxPathPeers  = 4096
	maxPathVNIs   = 8
	maxPathSizes  = 8
	maxPathDelay  = 5 * time.Second
)

// underlayAddress is where PathCheck binds: --underlay-address, else the
// --listen host when it is an IPv4 address (the DaemonSet listens on
// status.hostIP, the node IP the tunnel uses).
func (s *Service) underlayAddress() (netip.Addr, string) { return underlayAddr(s.cfg) }

// underlayAddr is the node IP the tunnel uses (see underlayAddress); the
// OVS staged strategy binds its receive port to it.
func underlayAddr(cfg Config) (netip.Addr, string) {
	if cfg.UnderlayAddress != "" {
		a, err := netip.ParseAddr(cfg.UnderlayAddress)
		if err == nil {
			return a, ""
		}
	}
	host, _, err := net.SplitHostPort(cfg.ListenAddr)
	if err == nil {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() && !a.IsUnspecified() {
			return a, ""
		}
	}
	return netip.Addr{}, fmt.Sprintf("no underlay address: --listen %q has no IPv4 host; set --underlay-address to the node IP the tunnel sends from", cfg.ListenAddr)
}

// overlayVNIs are the VNIs the overlay puts on the wire: a kernel device's
// own; for OVS key=flow, --overlay-vnis or 0, openshift-sdn's netid of
// every namespace outside multitenant mode (its flows set no tun_id).
func (s *Service) overlayVNIs(st dataplane.State) []uint32 {
	if v, err := strconv.ParseUint(st.Detail["vni"], 10, 24); err == nil {
		return []uint32{uint32(v)}
	}
	if len(s.cfg.OverlayVNIs) == 0 {
		return []uint32{0}
	}
	out := make([]uint32, 0, len(s.cfg.OverlayVNIs))
	for _, v := range s.cfg.OverlayVNIs {
		out = append(out, uint32(v))
	}
	return out
}

// overlayMTU is the MTU of the overlay's inner packets: --overlay-mtu, a
// kernel device's MTU, or that of the interface holding the overlay
// (probe) address; 0 when none is known.
func (s *Service) overlayMTU(st dataplane.State) uint32 {
	if s.cfg.OverlayMTU > 0 {
		return uint32(s.cfg.OverlayMTU)
	}
	if v, err := strconv.Atoi(st.Detail["mtu"]); err == nil && v > 0 {
		return uint32(v)
	}
	if addr, _ := s.probes.status(); addr.IsValid() {
		if mtu := mtuOfAddr(addr.Addr()); mtu > 0 {
			return uint32(mtu)
		}
	}
	if ifi, err := net.InterfaceByName(probeInterface(s.cfg)); err == nil {
		return uint32(ifi.MTU)
	}
	return 0
}

func mtuOfAddr(a netip.Addr) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
					return ifi.MTU
				}
			}
		}
	}
	return 0
}

// pathInfo fills Info's path check fields.
func (s *Service) pathInfo(resp *agentv1.InfoResponse, st dataplane.State, read bool) {
	a, why := s.underlayAddress()
	if a.IsValid() {
		resp.UnderlayAddress = a.String()
	} else {
		resp.PathCheckOffReason = why
	}
	if read {
		resp.OverlayVnis = s.overlayVNIs(st)
		resp.OverlayMtu = s.overlayMTU(st)
	}
}

// PathCheck implements agentv1.AgentServiceServer. It changes nothing: the
// socket it binds is closed before it returns.
func (s *Service) PathCheck(ctx context.Context, req *agentv1.PathCheckRequest) (*agentv1.PathCheckResponse, error) {
	cfg, err := s.pathConfig(req)
	if err != nil {
		s.metrics.PathChecked("error", 0)
		return nil, err
	}
	if !s.pathMu.TryLock() {
		s.metrics.PathChecked("error", 0)
		return nil, status.Errorf(codes.FailedPrecondition, "node %s: another path check is running (one at a time: both would bind the same port)", s.cfg.NodeName)
	}
	defer s.pathMu.Unlock()
	start := time.Now()
	res, err := pathprobe.Run(ctx, cfg)
	var be *pathprobe.BindError
	switch {
	case errors.As(err, &be):
		s.metrics.PathChecked("port_in_use", 0)
		return nil, status.Errorf(codes.FailedPrecondition, "node %s: udp port %d on %s is not free: %v%s; the path check cannot bind it: pick another port or stop what holds it",
			s.cfg.NodeName, cfg.Port, cfg.Local, be.Err, s.holder(ctx, tunnelport.Port(cfg.Port)))
	case err != nil:
		s.metrics.PathChecked("error", 0)
		return nil, status.Errorf(codes.Internal, "node %s: path check: %v", s.cfg.NodeName, err)
	}
	resp := &agentv1.PathCheckResponse{Node: s.cfg.NodeName, Address: netip.AddrPortFrom(cfg.Local, cfg.Port).String(), TookMicros: time.Since(start).Microseconds()}
	passed := map[string]bool{}
	for i := range res {
		if pathAlwaysPasses(s.cfg.NodeName) { // test-only build: faultinject.go
			res[i].Answered, res[i].Received = true, true
		}
		if pathWireAlways(s.cfg.NodeName) && !res[i].Control { // test-only build: faultinject.go
			res[i].Wire = true
		}
	}
	for _, r := range res {
		if !r.Control {
			passed[r.Peer] = passed[r.Peer] || r.Answered || r.Received || r.Wire
		}
		resp.Results = append(resp.Results, &agentv1.PathProbeResult{Peer: r.Peer, Vni: r.VNI, Size: uint32(r.Size),
			Sent: uint32(r.Sent), Answered: r.Answered, Received: r.Received, SendError: r.SendErr,
			Control: r.Control, ControlError: r.ControlErr, Wire: r.Wire})
	}
	silent := 0
	for _, ok := range passed {
		if !ok {
			silent++
		}
	}
	s.metrics.PathChecked("ok", silent)
	return resp, nil
}

// holder names what holds port, as preflight does, when the backend can
// tell: " (held by socket inode 1234 (0.0.0.0:4889))".
func (s *Service) holder(ctx context.Context, port tunnelport.Port) string {
	_, be, err := s.core()
	if err != nil {
		return ""
	}
	c, err := be.Preflight(ctx, port)
	if err != nil || c.TargetHolder == "" {
		return ""
	}
	return " (held by " + c.TargetHolder + ")"
}

// pathConfig checks a PathCheck request; errors are INVALID_ARGUMENT
// naming the field.
func (s *Service) pathConfig(req *agentv1.PathCheckRequest) (pathprobe.Config, error) {
	bad := func(field string, v any, why string) error {
		return status.Errorf(codes.InvalidArgument, "%s %v: %s", field, v, why)
	}
	local, why := s.underlayAddress()
	if !local.IsValid() {
		return pathprobe.Config{}, status.Errorf(codes.FailedPrecondition, "node %s: %s", s.cfg.NodeName, why)
	}
	port, err := checkPort("port", req.GetPort())
	if err != nil {
		return pathprobe.Config{}, err
	}
	cfg := pathprobe.Config{Local: local, Port: uint16(port), CheckID: req.GetCheckId(),
		Window: time.Duration(req.GetWindowMillis()) * time.Millisecond, Interval: time.Duration(req.GetIntervalMillis()) * time.Millisecond}
	switch {
	case req.GetCheckId() == "":
		return cfg, bad("check_id", `""`, "empty: want the check's id")
	case cfg.Window <= 0 || cfg.Window > maxPathWindow:
		return cfg, bad("window_millis", req.GetWindowMillis(), fmt.Sprintf("want 1–%d", maxPathWindow.Milliseconds()))
	case cfg.Interval <= 0 || cfg.Interval > cfg.Window:
		return cfg, bad("interval_millis", req.GetIntervalMillis(), "want more than 0 and at most window_millis")
	case len(req.GetVnis()) == 0 || len(req.GetVnis()) > maxPathVNIs:
		return cfg, bad("vnis", req.GetVnis(), fmt.Sprintf("want 1–%d VNIs", maxPathVNIs))
	case len(req.GetSizes()) == 0 || len(req.GetSizes()) > maxPathSizes:
		return cfg, bad("sizes", req.GetSizes(), fmt.Sprintf("want 1–%d sizes", maxPathSizes))
	case req.GetStartUnixNano() > s.clock.Now().Add(maxPathDelay).UnixNano():
		return cfg, bad("start_unix_nano", req.GetStartUnixNano(), fmt.Sprintf("more than %s ahead of this agent's clock (%d)", maxPathDelay, s.clock.Now().UnixNano()))
	case len(req.GetPeers())+len(req.GetListenFor()) > maxPathPeers:
		return cfg, bad("peers", len(req.GetPeers())+len(req.GetListenFor()), fmt.Sprintf("too many: at most %d", maxPathPeers))
	}
	cfg.VNIs = req.GetVnis()
	if at := req.GetStartUnixNano(); at > 0 {
		cfg.Delay = max(0, time.Unix(0, at).Sub(s.clock.Now()))
	}
	if req.GetControlPort() != 0 {
		cp, err := checkPort("control_port", req.GetControlPort())
		if err != nil {
			return cfg, err
		}
		cfg.ControlPort, cfg.ControlVNI = uint16(cp), req.GetControlVni()
	}
	for _, z := range req.GetSizes() {
		cfg.Sizes = append(cfg.Sizes, int(z))
	}
	seen := map[string]bool{}
	parse := func(field string, in []*agentv1.PathPeer) ([]pathprobe.Peer, error) {
		var out []pathprobe.Peer
		for i, p := range in {
			a, err := netip.ParseAddr(p.GetAddress())
			switch {
			case err != nil || !a.Is4():
				return nil, bad(fmt.Sprintf("%s[%d].address", field, i), fmt.Sprintf("%q (peer %q)", p.GetAddress(), p.GetName()), "want the peer's underlay IPv4 address")
			case p.GetName() == "" || p.GetName() == s.cfg.NodeName:
				return nil, bad(fmt.Sprintf("%s[%d].name", field, i), fmt.Sprintf("%q", p.GetName()), "empty or this node itself")
			case seen[p.GetName()]:
				return nil, bad(fmt.Sprintf("%s[%d].name", field, i), fmt.Sprintf("%q", p.GetName()), "given twice")
			}
			seen[p.GetName()] = true
			out = append(out, pathprobe.Peer{Name: p.GetName(), Addr: a})
		}
		return out, nil
	}
	if cfg.Peers, err = parse("peers", req.GetPeers()); err != nil {
		return cfg, err
	}
	if cfg.ListenFor, err = parse("listen_for", req.GetListenFor()); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, status.Error(codes.InvalidArgument, err.Error())
	}
	return cfg, nil
}
