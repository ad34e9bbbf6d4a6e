package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cutover-dev/cutover/agent/probe"
	"github.com/cutover-dev/cutover/pkg/ifaddr"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// overlayProbe runs the probe mesh on the node's overlay address: it finds
// the address (flags, else the probe interface's IPv4), keeps looking while
// there is none, restarts the mesh when the address changes, and says why
// probing is off when it is. The mesh and its peer set outlive every
// restart, so peers a Prepare set stay.
type overlayProbe struct {
	// coordPeers is set while the mesh probes the peers a Prepare gave.
	coordPeers atomic.Bool
	// static are the --probe-peers the agent started with: what the mesh
	// goes back to when the coordinator's sample lingers out or is parked.
	static []probe.Peer
	cfg    Config
	mesh   *probe.Mesh

	mu   sync.Mutex
	addr netip.AddrPort // where the mesh runs; zero while off
	off  string         // why it is off; "" while on
}

func newOverlayProbe(cfg Config, mesh *probe.Mesh) *overlayProbe {
	return &overlayProbe{cfg: cfg, mesh: mesh, static: mesh.Peers(), off: "looking for the overlay address"}
}

// backToStatic puts the --probe-peers back in place of the coordinator's
// sample (it lingered out, or the coordinator parked it).
func (p *overlayProbe) backToStatic() error {
	if err := p.mesh.SetPeers(p.static); err != nil {
		return err
	}
	p.coordPeers.Store(false)
	return nil
}

// status returns the address probes run on, or why there is none.
func (p *overlayProbe) status() (netip.AddrPort, string) {
	if p == nil {
		return netip.AddrPort{}, "probing disabled (--probe=false)"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr, p.off
}

func (p *overlayProbe) set(addr netip.AddrPort, off string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addr, p.off = addr, off
}

// overlayAddress is where the probe mesh should run, or why it cannot:
// --probe-listen as given, else --probe-address or the first primary,
// non-link-local IPv4 of the probe interface, with --probe-port.
func overlayAddress(cfg Config, addrs ifaddr.Reader) (netip.AddrPort, string) {
	if cfg.ProbeListen != "" {
		ap, err := netip.ParseAddrPort(cfg.ProbeListen)
		if err != nil { // Validate refuses it; kept for direct callers
			return netip.AddrPort{}, fmt.Sprintf("--probe-listen %q: %v", cfg.ProbeListen, err)
		}
		return ap, ""
	}
	port := tunnelport.Port(cfg.ProbePort)
	if cfg.ProbeAddress != "" {
		a, err := netip.ParseAddr(cfg.ProbeAddress)
		if err != nil {
			return netip.AddrPort{}, fmt.Sprintf("--probe-address %q: %v", cfg.ProbeAddress, err)
		}
		return netip.AddrPortFrom(a, uint16(port)), ""
	}
	dev := probeInterface(cfg)
	if addrs == nil {
		return netip.AddrPort{}, fmt.Sprintf("cannot read the addresses of %s (netlink unavailable); set --probe-address", dev)
	}
	list, err := addrs.IPv4(dev)
	switch {
	case ifaddr.IsNotFound(err):
		return netip.AddrPort{}, fmt.Sprintf("no overlay address: interface %s does not exist (yet?); set --probe-interface or --probe-address", dev)
	case err != nil:
		return netip.AddrPort{}, fmt.Sprintf("no overlay address: %v", err)
	}
	for _, a := range list {
		ip := a.Prefix.Addr()
		if !a.Secondary && ip.Is4() && !ip.IsLinkLocalUnicast() && !ip.IsUnspecified() {
			return netip.AddrPortFrom(ip, uint16(port)), ""
		}
	}
	return netip.AddrPort{}, fmt.Sprintf("no overlay address: interface %s has no usable IPv4 address (yet?); set --probe-address", dev)
}

// probeLookupEvery is how often the overlay address is looked up again:
// while there is none (the CNI configures it after the agent starts), and
// to follow a change. One netlink request; cheap.
const probeLookupEvery = time.Second

// run keeps the mesh on the overlay address until ctx ends. every is how
// often the address is looked up again (probeLookupEvery); openAddrs opens
// the address reader, retried while it fails.
func (p *overlayProbe) run(ctx context.Context, every time.Duration, openAddrs func() (ifaddr.Reader, error), log *slog.Logger) {
	var addrs ifaddr.Reader
	lastWhy := ""
	lookup := func() (netip.AddrPort, string) {
		if addrs == nil && p.cfg.ProbeListen == "" && p.cfg.ProbeAddress == "" {
			r, err := openAddrs()
			if err != nil {
				return netip.AddrPort{}, fmt.Sprintf("cannot read interface addresses: %v", err)
			}
			addrs = r
		}
		return overlayAddress(p.cfg, addrs)
	}
	wait := func() bool {
		t := time.NewTimer(every)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		addr, why := lookup()
		if !addr.IsValid() {
			p.set(netip.AddrPort{}, why)
			if why != lastWhy { // once per distinct cause, not every retry
				log.Warn("overlay probe mesh off; the agent serves on and looks again", "why", why, "every", every)
				lastWhy = why
			}
			if !wait() {
				return
			}
			continue
		}
		runCtx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- p.mesh.RunAt(runCtx, addr) }()
		p.set(addr, "")
		log.Info("overlay probe mesh on", "address", addr.String(), "peers", len(p.mesh.Peers()))
		lastWhy = ""
		var err error
	watch:
		for {
			t := time.NewTimer(every)
			select {
			case err = <-errc:
				t.Stop()
				break watch
			case <-t.C:
				// Follow the overlay address: the CNI may re-address the
				// interface (a node's subnet re-assigned).
				if next, _ := lookup(); next.IsValid() && next != addr {
					log.Info("overlay address changed; moving the probe mesh", "from", addr.String(), "to", next.String())
					cancel()
					err = <-errc
					break watch
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			why := fmt.Sprintf("probe socket on %s: %v", addr, err)
			p.set(netip.AddrPort{}, why)
			log.Warn("overlay probe mesh stopped; retrying", "err", err, "every", every)
			lastWhy = why
			if !wait() {
				return
			}
		}
	}
}
