package udpport_test

import (
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/vishvananda/netlink"
)

func newNS(t *testing.T) string {
	t.Helper()
	return testenv.Netns(t, "cot-udpport")
}

func open(t *testing.T, ns string) udpport.Kernel {
	t.Helper()
	k, err := udpport.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.H.Close)
	return k
}

// listen binds a UDP socket inside ns; the socket stays in ns after the
// thread returns to its own namespace.
func listen(t *testing.T, ns, network, addr string) (*net.UDPConn, uint32) {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(ns, func() error {
		a, err := net.ResolveUDPAddr(network, addr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP(network, a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return c, uint32(st.Ino)
}

func TestBoundSocket(t *testing.T) {
	ns := newNS(t)
	k := open(t, ns)
	for _, tc := range []struct{ network, addr, local string }{
		{"udp4", "127.0.0.1:4889", "127.0.0.1:4889"},
		{"udp6", "[::1]:4889", "[::1]:4889"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			if free, h, err := k.Free(4889); err != nil || !free {
				t.Fatalf("before bind: Free = %v, %v, %v; want free", free, h, err)
			}
			c, ino := listen(t, ns, tc.network, tc.addr)
			free, h, err := k.Free(4889)
			if err != nil || free {
				t.Fatalf("bound: Free = %v, %v, %v; want held", free, h, err)
			}
			if h.Kind != "socket" || h.Inode != ino || h.Local != tc.local {
				t.Errorf("holder = %+v, want socket inode %d at %s", h, ino, tc.local)
			}
			if !strings.Contains(h.String(), fmt.Sprintf("socket inode %d", ino)) {
				t.Errorf("holder string %q does not name the inode", h)
			}
			c.Close()
			if free, h, err := k.Free(4889); err != nil || !free {
				t.Fatalf("after close: Free = %v, %v, %v; want free", free, h, err)
			}
		})
	}
}

// TestHostSocketInvisible proves the check looks at the target namespace and
// not at the test's own: a socket bound in the caller's namespace on the port
// does not make it held in the fresh one.
func TestHostSocketInvisible(t *testing.T) {
	ns := newNS(t)
	k := open(t, ns)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	if free, h, err := k.Free(port); err != nil || !free {
		t.Fatalf("Free(%d) in %s = %v, %v, %v; want free (the socket is in another namespace)", port, ns, free, h, err)
	}
}

func TestVxlanDevice(t *testing.T) {
	ns := newNS(t)
	k := open(t, ns)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxt0"}, VxlanId: 42, Port: 4789, SrcAddr: net.ParseIP("198.18.0.1")}
	if err := k.H.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	// Down: the kernel has opened no socket, but the device holds the port.
	free, h, err := k.Free(4789)
	if err != nil || free || h.String() != "vxlan device vxt0" {
		t.Fatalf("down device: Free(4789) = %v, %v, %v; want held by vxlan device vxt0", free, h, err)
	}
	if err := k.H.LinkSetUp(vx); err != nil {
		t.Fatal(err)
	}
	free, h, err = k.Free(4789)
	if err != nil || free || h.String() != "vxlan device vxt0" {
		t.Fatalf("up device: Free(4789) = %v, %v, %v; want held by vxlan device vxt0", free, h, err)
	}
	if free, _, err := k.Free(4889); err != nil || !free {
		t.Fatalf("Free(4889) = %v, %v; want free", free, err)
	}
}

// TestHandleWithoutSockDiag: a handle opened without NETLINK_INET_DIAG would
// silently look at the caller's namespace; Free must refuse it.
func TestHandleWithoutSockDiag(t *testing.T) {
	ns := newNS(t)
	nsh, err := netns.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, _, err := udpport.Free(h, 4789); err == nil || !strings.Contains(err.Error(), "NETLINK_INET_DIAG") {
		t.Fatalf("Free with a route-only handle: err = %v, want a refusal naming NETLINK_INET_DIAG", err)
	}
}
