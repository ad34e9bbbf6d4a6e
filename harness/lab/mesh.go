package lab

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
)

// Mesh is the outcome of a full-mesh overlay reachability check: OK[a][b]
// says whether node a got an ICMP echo reply from node b's overlay address.
type Mesh struct {
	Nodes []string
	OK    [][]bool
}

// String is canonical text, one line per ordered pair, for tests to compare.
func (m Mesh) String() string {
	var b strings.Builder
	for a := range m.Nodes {
		for c := range m.Nodes {
			if a == c {
				continue
			}
			res := "ok"
			if !m.OK[a][c] {
				res = "FAIL"
			}
			fmt.Fprintf(&b, "%s -> %s %s\n", m.Nodes[a], m.Nodes[c], res)
		}
	}
	return b.String()
}

// AllOK reports whether every ordered pair is reachable.
func (m Mesh) AllOK() bool {
	for a := range m.OK {
		for c := range m.OK[a] {
			if a != c && !m.OK[a][c] {
				return false
			}
		}
	}
	return true
}

// Mesh pings every node's overlay address from every other node (ICMP echo
// from a raw socket opened inside the source namespace, so no ping binary is
// needed) and waits up to timeout for each pair's reply, retrying every
// 100 ms: the first packets of a fresh pair wait for ARP through the tunnel
// and, on OVS, for the userspace tunnel's own neighbor resolution.
func (l *Lab) Mesh(ctx context.Context, timeout time.Duration) (Mesh, error) {
	nodes := l.Nodes()
	m := Mesh{OK: make([][]bool, len(nodes))}
	for _, n := range nodes {
		m.Nodes = append(m.Nodes, n.Name)
	}
	targets := make([]netip.Addr, len(nodes))
	for k, n := range nodes {
		targets[k] = n.OverlayIP
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for a, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := pingAll(ctx, n.Netns, targets, a, timeout)
			mu.Lock()
			defer mu.Unlock()
			m.OK[a] = ok
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}()
	}
	wg.Wait()
	return m, errors.Join(errs...)
}

// pingAll sends ICMP echo requests from namespace ns to every target except
// index self until each answered or timeout passed.
func pingAll(ctx context.Context, ns string, targets []netip.Addr, self int, timeout time.Duration) ([]bool, error) {
	var conn *net.IPConn
	err := netns.Do(ns, func() error {
		// The socket stays in ns after the thread leaves it.
		c, err := net.ListenIP("ip4:icmp", &net.IPAddr{IP: net.IPv4zero})
		conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("icmp socket: %w", err)
	}
	defer func() { _ = conn.Close() }()
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])

	ok := make([]bool, len(targets))
	byAddr := map[netip.Addr]int{}
	for k, t := range targets {
		if k != self {
			byAddr[t] = k
		}
	}
	deadline := time.Now().Add(timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	done := make(chan struct{})
	var mu sync.Mutex
	go func() { // reader
		defer close(done)
		buf := make([]byte, 1500)
		for {
			_ = conn.SetReadDeadline(deadline)
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			// Go strips the IPv4 header of ip4:icmp reads: buf is ICMP.
			if n < 8 || buf[0] != 0 || buf[1] != 0 || binary.BigEndian.Uint16(buf[4:]) != id {
				continue
			}
			a, aok := netip.AddrFromSlice(from.(*net.IPAddr).IP.To4())
			if k, known := byAddr[a]; aok && known {
				mu.Lock()
				ok[k] = true
				left := 0
				for k2 := range byAddr {
					if !ok[byAddr[k2]] {
						left++
					}
				}
				mu.Unlock()
				if left == 0 {
					return
				}
			}
		}
	}()
	var seq uint16
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		mu.Lock()
		var pending []netip.Addr
		for a, k := range byAddr {
			if !ok[k] {
				pending = append(pending, a)
			}
		}
		mu.Unlock()
		seq++
		for _, a := range pending {
			// Send errors (no route, ARP failed) count as "no reply yet".
			_, _ = conn.WriteTo(echoRequest(id, seq), &net.IPAddr{IP: a.AsSlice()})
		}
		select {
		case <-done:
			return ok, nil
		case <-ctx.Done():
			_ = conn.Close()
			<-done
			return ok, ctx.Err()
		case <-tick.C:
		}
	}
}

func echoRequest(id, seq uint16) []byte {
	b := make([]byte, 16)
	b[0] = 8 // echo request
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "cutover!")
	binary.BigEndian.PutUint16(b[2:], icmpChecksum(b))
	return b
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
