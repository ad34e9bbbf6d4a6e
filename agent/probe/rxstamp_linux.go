package probe

import (
	"net"
	"syscall"
	"time"
	"unsafe"
)

// rxStampsSupported says whether answers carry the kernel receive stamp.
const rxStampsSupported = true

// enableRxStamps asks the kernel to stamp every datagram with its arrival
// time (SO_TIMESTAMPNS, the wall clock), so an answer's time is when it
// reached the node, not when a busy agent got round to reading it.
func enableRxStamps(c *net.UDPConn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	})
}

// rxStamp is the arrival time in a datagram's control messages, if any.
func rxStamp(oob []byte) (time.Time, bool) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Unix()), true
		}
	}
	return time.Time{}, false
}
