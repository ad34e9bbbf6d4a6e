package probe

import (
	"syscall"
	"time"
	"unsafe"
)

// rxStampsSupported says whether answers carry the kernel receive stamp.
const rxStampsSupported = true

// rxStamp is the arrival time in a datagram's control messages, if any.
// It walks the headers in place: syscall.ParseSocketControlMessage
// allocates for every datagram, on every tick.
func rxStamp(oob []byte) (time.Time, bool) {
	hdr := syscall.CmsgLen(0)
	for len(oob) >= hdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		n := int(h.Len)
		if n < hdr || n > len(oob) {
			return time.Time{}, false
		}
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS && n-hdr >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&oob[hdr]))
			return time.Unix(ts.Unix()), true
		}
		next := syscall.CmsgSpace(n - hdr)
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	return time.Time{}, false
}
