package probe

import (
	"net/netip"
	"testing"
)

// A tick queues its datagrams and flushes them every interval: after the
// first, that must allocate nothing, or the mesh feeds the GC at its
// rate.
func TestFlushKeepsItsBuffers(t *testing.T) {
	s, err := listenSock(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Skipf("no UDP socket on loopback: %v", err)
	}
	defer s.close()
	b := newBuffers()
	to := netip.MustParseAddrPort("127.0.0.1:9") // discard: nothing need listen
	tick := func() {
		for i := range 6 {
			b.add(packet{kind: kindReq, seq: uint64(i), ts: 1}, to)
		}
		b.flush(s)
	}
	for range 100 {
		tick()
	}
	if c := cap(b.tx); c != len(b.txBytes) {
		t.Fatalf("after 100 flushes the batch holds %d datagrams, want %d", c, len(b.txBytes))
	}
	if n := testing.AllocsPerRun(100, tick); n != 0 {
		t.Errorf("a tick's add and flush allocate %v times", n)
	}
}
