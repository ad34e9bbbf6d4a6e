package probe

import (
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// cmsg appends one control message of level and typ carrying data, padded
// as the kernel pads it.
func cmsg(oob []byte, level, typ int32, data []byte) []byte {
	b := make([]byte, syscall.CmsgSpace(len(data)))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(syscall.CmsgLen(len(data)))
	copy(b[syscall.CmsgLen(0):], data)
	return append(oob, b...)
}

func TestRxStamp(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	ts := syscall.NsecToTimespec(at.UnixNano())
	stamp := unsafe.Slice((*byte)(unsafe.Pointer(&ts)), unsafe.Sizeof(ts))
	other := cmsg(nil, syscall.SOL_IP, syscall.IP_TTL, []byte{64, 0, 0, 0})
	for _, tc := range []struct {
		name string
		oob  []byte
		ok   bool
	}{
		{"stamp alone", cmsg(nil, syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS, stamp), true},
		{"after another message", cmsg(append([]byte(nil), other...), syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS, stamp), true},
		{"none", nil, false},
		{"another message only", other, false},
		{"truncated stamp", cmsg(nil, syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS, stamp[:8]), false},
		{"header claims more than there is", cmsg(nil, syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS, stamp)[:20], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rxStamp(tc.oob)
			if ok != tc.ok || (ok && !got.Equal(at)) {
				t.Fatalf("rxStamp = %v, %v; want %v, %v", got, ok, at, tc.ok)
			}
		})
	}
	oob := cmsg(append([]byte(nil), other...), syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS, stamp)
	if n := testing.AllocsPerRun(100, func() { _, _ = rxStamp(oob) }); n != 0 {
		t.Errorf("rxStamp allocates %v times a datagram; every tick reads every datagram through it", n)
	}
}
