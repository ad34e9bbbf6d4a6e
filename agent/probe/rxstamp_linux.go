package probe

import (
	"syscall"
	"time"
	"unsafe"
)

// rxStampsSupported says whether answers carry the kernel receive stamp.
const rxStampsSupported = true

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
