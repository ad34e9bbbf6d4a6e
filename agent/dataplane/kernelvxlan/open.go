package kernelvxlan

import (
	"fmt"

	"github.com/cutover-dev/cutover/pkg/conntrack"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// Open builds the backend over the kernel drivers of the network namespace
// nsName ("" for the caller's own: the host, for the agent). It fills the
// drivers cfg leaves nil: VXLAN, Ports, and Conntrack when
// conntrackCleanup is set. The returned function closes what Open opened.
func Open(nsName string, cfg Config, conntrackCleanup bool) (*Backend, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if cfg.VXLAN == nil {
		k, err := vxlan.Open(nsName)
		if err != nil {
			return nil, nil, fmt.Errorf("kernel-vxlan backend: %w", err)
		}
		closers = append(closers, k.Close)
		// The old device is deleted at Finalize, after every node flipped
		// (see vxlan.Kernel.KeepOld), not inside Commit.
		k.KeepOld = true
		cfg.VXLAN = k
	}
	if cfg.Ports == nil || (conntrackCleanup && cfg.Conntrack == nil) {
		p, err := udpport.Open(nsName)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("kernel-vxlan backend: %w", err)
		}
		closers = append(closers, p.H.Close)
		if cfg.Ports == nil {
			cfg.Ports = p
		}
		if conntrackCleanup && cfg.Conntrack == nil {
			// pkg/conntrack has no constructor for a namespace and this
			// package may not build a netlink handle (depguard). The
			// udpport handle has no NETLINK_NETFILTER socket, and for a
			// protocol it has no socket for, netlink opens a fresh one in
			// the calling thread's namespace: the host's for the agent,
			// and nsName's when the call runs inside netns.Do.
			k := conntrack.Kernel{H: p.H}
			if nsName == "" {
				cfg.Conntrack = k
			} else {
				cfg.Conntrack = nsConntrack{ns: nsName, k: k}
			}
		}
	}
	b, err := New(cfg)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return b, closeAll, nil
}

// nsConntrack runs the deletion on a thread inside a named namespace.
type nsConntrack struct {
	ns string
	k  conntrack.Kernel
}

func (c nsConntrack) DeleteUDPDstPort(port uint16) (int, error) {
	var n int
	err := netns.Do(c.ns, func() error {
		var err error
		n, err = c.k.DeleteUDPDstPort(port)
		return err
	})
	return n, err
}
