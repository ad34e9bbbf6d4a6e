package lab_test

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// packetCost is what one probe-sized datagram costs the kernel on a lab,
// in CPU microseconds of the calling thread, sent and read the way the
// mesh does on a tick (agent/probe): SendUS a datagram of a sendmmsg of
// tickBatch from one node's overlay address to another's (the VXLAN
// encapsulation, the veth, and the receive side in the peer's namespace,
// which the veth runs on the sender's CPU unless the softirq is
// deferred), RecvUS a datagram of a recvmmsg of as many, with its receive
// stamp. Each includes its share of the call's entry and exit. The
// batches go every interval, as a tick's do: sent back to back, with the
// caches warm, a datagram costs half or less. Each is the median over the
// batches.
type packetCost struct {
	SendUS     float64 `json:"send_us_per_packet"`
	RecvUS     float64 `json:"recv_us_per_packet"`
	Packets    int     `json:"packets"`
	IntervalMS float64 `json:"interval_ms"`
}

// tickBatch is what a tick of 3 peers sends: 3 probes and 3 answers.
const tickBatch = 6

// calibratePort is a port no lab process uses, on the overlay addresses.
const calibratePort = 9499

// calibrate measures packetCost between the lab's first two nodes, on a
// thread of its own (its CPU clock is the measure).
func calibrate(b *testing.B, l *lab.Lab, every time.Duration) packetCost {
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

	// One destination for the whole batch; the kernel reads the headers.
	var dst unix.RawSockaddrInet4
	dst.Family = unix.AF_INET
	dst.Addr = to.OverlayIP.As4()
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&dst.Port))[:], calibratePort)
	payload := make([]byte, 21) // a probe's size (agent/probe)
	out := make([]mmsghdr, tickBatch)
	outIov := make([]unix.Iovec, tickBatch)
	in := make([]mmsghdr, tickBatch)
	inIov := make([]unix.Iovec, tickBatch)
	inBuf := make([][1500]byte, tickBatch)
	inOOB := make([][128]byte, tickBatch)
	for i := range tickBatch {
		outIov[i] = unix.Iovec{Base: &payload[0]}
		outIov[i].SetLen(len(payload))
		out[i].hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&dst)), Namelen: unix.SizeofSockaddrInet4, Iov: &outIov[i]}
		out[i].hdr.SetIovlen(1)
		inIov[i] = unix.Iovec{Base: &inBuf[i][0]}
		inIov[i].SetLen(len(inBuf[i]))
	}
	rounds := int(min(2000, 3*time.Second/every))
	// Per round, per datagram: the median of those, not the mean, because
	// on a virtual machine a round the host preempted the thread in counts
	// that time as the thread's, and one such round in 300 moved the mean
	// at 10 ms from 19 to 45 µs a send between two runs.
	var sendPer, recvPer []float64
	sent, got := 0, 0
	for range rounds {
		time.Sleep(every)
		for i := range tickBatch { // the kernel writes back lengths
			in[i].hdr = unix.Msghdr{Iov: &inIov[i], Control: &inOOB[i][0]}
			in[i].hdr.SetIovlen(1)
			in[i].hdr.SetControllen(len(inOOB[i]))
		}
		t0 := threadCPU(b)
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(tx), uintptr(unsafe.Pointer(&out[0])), tickBatch, unix.MSG_DONTWAIT, 0, 0)
		t1 := threadCPU(b)
		if e != 0 {
			b.Fatalf("calibrate: sendmmsg %s -> %s: %v", from.Name, to.Name, e)
		}
		m, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(rx), uintptr(unsafe.Pointer(&in[0])), tickBatch, unix.MSG_DONTWAIT, 0, 0)
		t2 := threadCPU(b)
		if n > 0 {
			sendPer = append(sendPer, float64(t1-t0)/float64(n))
			sent += int(n)
		}
		if e == 0 && m > 0 {
			recvPer = append(recvPer, float64(t2-t1)/float64(m))
			got += int(m)
		}
	}
	runtime.KeepAlive(payload)
	if sent < rounds*tickBatch/2 || got < sent/2 {
		b.Fatalf("calibrate: %d datagrams sent %s -> %s of %d, %d read at once; the per-packet cost would be a guess", sent, from.Name, to.Name, rounds*tickBatch, got)
	}
	return packetCost{SendUS: median(sendPer) / 1e3, RecvUS: median(recvPer) / 1e3, Packets: sent,
		IntervalMS: float64(every) / 1e6}
}

// mmsghdr is struct mmsghdr (as agent/probe has it).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
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
