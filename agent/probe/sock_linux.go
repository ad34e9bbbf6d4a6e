package probe

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock is the mesh's UDP socket: a plain blocking socket, read and written
// with recvmmsg and sendmmsg, outside the Go runtime's poller (batch.go
// says why). The reader's blocking read gives up after readTimeout, so
// that it sees the loop tick or end.
type sock struct {
	fd int
	v6 bool
}

// readTimeout bounds a blocking read (SO_RCVTIMEO), a backstop: the
// mesh's end wakes the reader at once (wake), and the reader need not
// notice the mesh ticking (both may read meanwhile).
const readTimeout = time.Second

// mmsghdr is struct mmsghdr: one message header and the byte count the
// kernel writes back (Go aligns it as C does).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// scratch is what one goroutine's batch calls hand the kernel.
type scratch struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrAny
}

func newScratch(n int) *scratch {
	return &scratch{hdrs: make([]mmsghdr, n), iovs: make([]unix.Iovec, n), names: make([]unix.RawSockaddrAny, n)}
}

func listenSock(ap netip.AddrPort) (*sock, error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	s := &sock{v6: ap.Addr().Is6()}
	family := unix.AF_INET
	if s.v6 {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, err
	}
	s.fd = fd
	tv := unix.NsecToTimeval(readTimeout.Nanoseconds())
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	if s.v6 {
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	// SO_TIMESTAMPNS: every datagram carries its arrival time (the wall
	// clock), so an answer read on a later tick counts when it arrived.
	err = errors.Join(
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
	)
	if err == nil {
		err = unix.Bind(fd, sa)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return s, nil
}

func (s *sock) close() error { return unix.Close(s.fd) }

// wake returns a blocking read at once: shutting the socket's receive side
// wakes its readers (Linux does so for UDP too, and says ENOTCONN).
func (s *sock) wake() { _ = unix.Shutdown(s.fd, unix.SHUT_RD) }

// read reads up to len(ms) datagrams: with wait, blocking until the first
// arrives (or readTimeout: errAgain), else only what is there.
func (s *sock) read(sc *scratch, ms []msg, wait bool) (int, error) {
	n := min(len(ms), len(sc.hdrs))
	for i := range n {
		sc.iovs[i] = unix.Iovec{Base: &ms[i].buf[0]}
		sc.iovs[i].SetLen(len(ms[i].buf))
		sc.hdrs[i] = mmsghdr{hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sc.names[i])), Namelen: unix.SizeofSockaddrAny,
			Iov: &sc.iovs[i], Control: &ms[i].oob[0]}}
		sc.hdrs[i].hdr.SetIovlen(1)
		sc.hdrs[i].hdr.SetControllen(len(ms[i].oob))
	}
	flags := unix.MSG_DONTWAIT
	if wait {
		flags = unix.MSG_WAITFORONE
	}
	// Only the reader's read blocks, and the runtime must know (Syscall6):
	// its P goes to other goroutines meanwhile. The tick's reads and
	// writes return at once, so they go raw: entering the scheduler's
	// syscall path for them is what woke sysmon on every tick (pace_linux.go).
	call := unix.RawSyscall6
	if wait {
		call = unix.Syscall6
	}
	for {
		r, _, e := call(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&sc.hdrs[0])), uintptr(n), uintptr(flags), 0, 0)
		runtime.KeepAlive(ms)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errAgain
		default:
			return 0, e
		}
		got := int(r)
		for i := range got {
			ms[i].n = int(sc.hdrs[i].n)
			ms[i].oobn = int(sc.hdrs[i].hdr.Controllen)
			ms[i].addr = sockaddrAddr(&sc.names[i])
		}
		return got, nil
	}
}

// write sends ms in one sendmmsg, never blocking: a full socket buffer
// drops what did not fit, as the network would. It is a raw syscall (see
// read): the kernel's VXLAN path runs in it, tens of microseconds, during
// which a stop of the world waits for it.
func (s *sock) write(sc *scratch, ms []msg) (int, error) {
	n := min(len(ms), len(sc.hdrs))
	for i := range n {
		sc.iovs[i] = unix.Iovec{Base: &ms[i].buf[0]}
		sc.iovs[i].SetLen(ms[i].n)
		namelen := putSockaddr(&sc.names[i], ms[i].addr, s.v6)
		sc.hdrs[i] = mmsghdr{hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sc.names[i])), Namelen: namelen, Iov: &sc.iovs[i]}}
		sc.hdrs[i].hdr.SetIovlen(1)
	}
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&sc.hdrs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		runtime.KeepAlive(ms)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

// putSockaddr writes ap into sa for the socket's family and returns its
// length.
func putSockaddr(sa *unix.RawSockaddrAny, ap netip.AddrPort, v6 bool) uint32 {
	if !v6 {
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*p = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().Unmap().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.Port))[:], ap.Port())
		return unix.SizeofSockaddrInet4
	}
	p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
	*p = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ap.Addr().As16()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.Port))[:], ap.Port())
	return unix.SizeofSockaddrInet6
}

// sockaddrAddr is the sender's address the kernel wrote into sa.
func sockaddrAddr(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:]))
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr).Unmap(), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:]))
	}
	return netip.AddrPort{}
}
