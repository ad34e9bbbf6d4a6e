package lab_test

import (
	"net/netip"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// packetCost is what one probe-sized datagram costs the kernel on a lab,
// in CPU microseconds of the calling thread: SendUS a send from one node's
// overlay address to another's (the VXLAN encapsulation, the veth, and the
// receive side in the peer's namespace, which the veth runs on the
// sender's CPU unless the softirq is deferred), RecvUS a read with its
// receive stamp. One syscall a datagram, so each includes a syscall's
// entry and exit, which the agent's batches share: an upper bound.
type packetCost struct {
	SendUS  float64 `json:"send_us_per_packet"`
	RecvUS  float64 `json:"recv_us_per_packet"`
	Packets int     `json:"packets"`
}

// calibratePort is a port no lab process uses, on the overlay addresses.
const calibratePort = 9499

// calibrate measures packetCost between the lab's first two nodes, on a
// thread of its own (its CPU clock is the measure).
func calibrate(b *testing.B, l *lab.Lab) packetCost {
	nodes := l.Nodes()
	if len(nodes) < 2 {
		b.Fatal("calibrate: the lab has fewer than two nodes")
	}
	from, to := nodes[0], nodes[1]
	tx := udpIn(b, from.Netns, from.OverlayIP, false)
	defer unix.Close(tx)
	rx := udpIn(b, to.Netns, to.OverlayIP, true)
	defer unix.Close(rx)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dst := &unix.SockaddrInet4{Port: calibratePort, Addr: to.OverlayIP.As4()}
	buf := make([]byte, 21) // a probe's size (agent/probe)
	rbuf, oob := make([]byte, 1500), make([]byte, 128)
	const n = 20000
	var send, recv int64
	got := 0
	for range n {
		t0 := threadCPU(b)
		if err := unix.Sendto(tx, buf, unix.MSG_DONTWAIT, dst); err != nil {
			b.Fatalf("calibrate: send %s -> %s: %v", from.Name, to.Name, err)
		}
		t1 := threadCPU(b)
		_, _, _, _, err := unix.Recvmsg(rx, rbuf, oob, unix.MSG_DONTWAIT)
		t2 := threadCPU(b)
		send += t1 - t0
		if err == nil {
			recv += t2 - t1
			got++
		}
	}
	if got < n/2 {
		b.Fatalf("calibrate: %d of %d datagrams %s -> %s arrived at once; the per-packet cost would be a guess", got, n, from.Name, to.Name)
	}
	return packetCost{SendUS: float64(send) / n / 1e3, RecvUS: float64(recv) / float64(got) / 1e3, Packets: n}
}

// udpIn opens a UDP socket in namespace ns bound to ip:calibratePort (the
// socket stays in ns).
func udpIn(b *testing.B, ns string, ip netip.Addr, stamp bool) int {
	var fd int
	err := netns.Do(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		if err != nil {
			return err
		}
		if stamp {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
				return err
			}
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: calibratePort, Addr: ip.As4()})
	})
	if err != nil {
		b.Fatalf("calibrate: socket in %s on %s:%d: %v", ns, ip, calibratePort, err)
	}
	return fd
}

func threadCPU(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
}
