//go:build !linux

package probe

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"time"
)

// sock is the mesh's UDP socket where there is no recvmmsg: one datagram a
// call through Go's net package (the agent ships for Linux only; this
// keeps the package building and testable elsewhere).
type sock struct{ c *net.UDPConn }

const readTimeout = time.Second

type scratch struct{}

func newScratch(int) *scratch { return &scratch{} }

func listenSock(ap netip.AddrPort) (*sock, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return nil, err
	}
	return &sock{c: c}, nil
}

func (s *sock) close() error { return s.c.Close() }

func (s *sock) wake() { _ = s.c.SetReadDeadline(time.Now()) }

func (s *sock) read(_ *scratch, ms []msg, wait bool) (int, error) {
	d := time.Now().Add(readTimeout)
	if !wait {
		d = time.Now().Add(time.Microsecond)
	}
	_ = s.c.SetReadDeadline(d)
	n, oobn, _, from, err := s.c.ReadMsgUDPAddrPort(ms[0].buf, ms[0].oob)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, errAgain
	}
	if err != nil {
		return 0, err
	}
	ms[0].n, ms[0].oobn, ms[0].addr = n, oobn, from
	return 1, nil
}

func (s *sock) write(_ *scratch, ms []msg) (int, error) {
	for i := range ms {
		if _, err := s.c.WriteToUDPAddrPort(ms[i].buf[:ms[i].n], ms[i].addr); err != nil {
			return i, err
		}
	}
	return len(ms), nil
}
