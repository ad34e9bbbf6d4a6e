package pathprobe

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const rcvBuf = 4 << 20

// dontFragment sets IP_MTU_DISCOVER to IP_PMTUDISC_DO (and a large receive buffer): the kernel sets DF
// on every datagram and never fragments one locally, so a frame too big
// for the path is dropped (or refused with EMSGSIZE) rather than split,
// as the overlay's own frames would be.
func dontFragment(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		// Every peer's frames of a round arrive at once (31 peers × 10
		// frames of up to 1.5 kB at N=32): room for a few rounds, past
		// rmem_max when privileged; best effort.
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
		}
	}); err != nil {
		return err
	}
	return serr
}
