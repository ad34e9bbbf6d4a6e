package pathprobe

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// dontFragment sets IP_MTU_DISCOVER to IP_PMTUDISC_DO: the kernel sets DF
// on every datagram and never fragments one locally, so a frame too big
// for the path is dropped (or refused with EMSGSIZE) rather than split,
// as the overlay's own frames would be.
func dontFragment(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}); err != nil {
		return err
	}
	return serr
}
