package pathprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Capture sees UDP datagrams to one or two ports arrive on any interface
// of the node's network namespace: an AF_PACKET socket with a BPF filter
// on the destination port. The packet socket gets a copy of each frame
// as the interface hands it to the stack: before netfilter, and before the
// overlay (kernel VXLAN, or OVS reading the NIC) takes it. It is how the
// check sees its control frames arrive on the current port, which the
// overlay holds (so it cannot be bound), and how it sees its frames to the
// port under test arrive on the same terms: a frame the capture sees and
// the check's socket does not crossed the underlay and was dropped by the
// node itself (its own firewall, before Prepare opens the port). Both
// ports observed alike, so the control compares like with like.
// It needs CAP_NET_RAW.
type Capture struct {
	fd int
}

// OpenCapture opens a capture of UDP/IPv4 to port, or to either of port
// and also when also is not 0.
func OpenCapture(port, also uint16) (*Capture, error) {
	if also == 0 {
		also = port
	}
	proto := int(htons(unix.ETH_P_IP))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("packet socket for udp/%d: %w", port, err)
	}
	// Cooked (SOCK_DGRAM) packets start at the IPv4 header.
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 9},                           // ip proto
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 7, K: 17},           // udp?
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6},                           // flags, fragment offset
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 5, Jf: 0, K: 0x1fff},      // a later fragment: no UDP header
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},                          // x = IP header length
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},                           // udp dst port
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: uint32(port)}, // the port?
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(also)}, // or the other?
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("packet socket for udp/%d: attach filter: %w", port, err)
	}
	// Frames queued before the filter was attached are read and dropped
	// by Run's parsing like any other stranger.
	tv := unix.NsecToTimeval((20 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("packet socket for udp/%d: %w", port, err)
	}
	return &Capture{fd: fd}, nil
}

// Run reads until deadline or stop is closed and calls seen with the
// source and destination addresses, UDP destination port and frame of
// every probe frame of nonce that arrived on the node, not one it sent.
func (c *Capture) Run(deadline time.Time, stop <-chan struct{}, nonce uint64, seen func(from, to netip.Addr, port uint16, f Frame)) {
	buf := make([]byte, MaxSize)
	for time.Now().Before(deadline) {
		select {
		case <-stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		// PACKET_OTHERHOST is kept: where the NIC is a port of a
		// userspace or bridged switch (the OVS lab's eth0 in br-ul), the
		// node's frames come to the bridge's MAC, not the NIC's, and the
		// current port's are taken by the switch before any other
		// interface sees them. The caller tells a frame for another node
		// by its destination address.
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		pkt := buf[:n]
		if len(pkt) < ipLen+udpLen {
			continue
		}
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < ipLen || len(pkt) < ihl+udpLen || int(binary.BigEndian.Uint16(pkt[2:])) != n {
			continue
		}
		f, err := Unmarshal(pkt[ihl+udpLen:])
		if err != nil || f.Nonce != nonce {
			continue
		}
		src, _ := netip.AddrFromSlice(pkt[12:16])
		dst, _ := netip.AddrFromSlice(pkt[16:20])
		seen(src, dst, binary.BigEndian.Uint16(pkt[ihl+2:]), f)
	}
}

// Close releases the socket.
func (c *Capture) Close() error { return unix.Close(c.fd) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }
