// Package pathprobe tests an underlay path for VXLAN with real VXLAN
// frames: an RFC 7348 header (I flag, a given VNI) in front of an inner
// Ethernet/IPv4/UDP frame that carries a nonce, sent over a UDP socket
// bound on the port under test, with don't-fragment set so that a path
// that cannot carry the overlay's full frames drops them instead of
// fragmenting them.
//
// The inner frame is built to be harmless should a real overlay
// decapsulate it (the control check on the current port, a misdirected
// frame): its destination MAC is a locally administered address no
// device owns, so a bridge floods it nowhere useful and a host stack
// drops it as PACKET_OTHERHOST; its inner IPv4 packet has TTL 1, goes
// from and to addresses of the benchmarking range 198.18.0.0/15 that no
// pod holds, to the UDP discard port.
package pathprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
)

// VXLAN, inner Ethernet, IPv4 and UDP header lengths.
const (
	vxlanLen = 8
	ethLen   = 14
	ipLen    = 20
	udpLen   = 8
	// OuterOverhead is what the outer IPv4 and UDP headers add to a
	// datagram's payload.
	OuterOverhead = ipLen + udpLen
	// Overhead is what VXLAN adds to an overlay packet (the inner IP
	// packet) on the wire: outer IPv4, UDP, VXLAN and inner Ethernet
	// headers. An overlay of MTU m sends outer packets of m+Overhead.
	Overhead = OuterOverhead + vxlanLen + ethLen
	// payloadLen is the fixed part of the inner UDP payload (magic,
	// kind, nonce, vni, size, seq).
	payloadLen = 8 + 1 + 8 + 4 + 2 + 4
	// MinSize is the smallest outer packet a probe fits in.
	MinSize = Overhead + ipLen + udpLen + payloadLen
	// MaxSize is the largest outer IPv4 packet.
	MaxSize = 65535
)

// Kind tells a request from its answer.
type Kind byte

// Frame kinds.
const (
	Request Kind = 1
	Answer  Kind = 2
	// Control is a frame sent to the current port, which the overlay
	// holds: nobody answers it; a Capture sees it arrive.
	Control Kind = 3
)

var magic = [8]byte{'C', 'U', 'T', 'O', 'V', 'E', 'R', 'P'}

// The inner frame's addresses: a locally administered destination MAC no
// device owns, and inner IPs from the benchmarking range no pod holds.
var (
	innerDstMAC = [6]byte{0x06, 0x43, 0x55, 0x54, 0x4f, 0x56}
	innerSrcMAC = [6]byte{0x06, 0x43, 0x55, 0x54, 0x4f, 0x57}
	innerSrcIP  = netip.MustParseAddr("198.19.255.253")
	innerDstIP  = netip.MustParseAddr("198.19.255.254")
)

// InnerDstMAC is the inner frame's destination MAC, for tests that check a
// decapsulated probe reached nobody.
func InnerDstMAC() [6]byte { return innerDstMAC }

// Frame is what a probe carries.
type Frame struct {
	Kind  Kind
	Nonce uint64 // the check's (Nonce(checkID))
	VNI   uint32 // 24 bits
	Size  int    // the outer IPv4 packet's length
	Seq   uint32
}

// Nonce is the nonce every frame of check id carries: peers derive the
// same one from the id alone, and frames of another check (an earlier
// one, or another coordinator's) are not counted.
func Nonce(checkID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(checkID))
	return h.Sum64()
}

// Marshal returns f as a UDP payload (VXLAN header onwards) for an outer
// packet of f.Size bytes.
func (f Frame) Marshal() ([]byte, error) {
	if f.Size < MinSize || f.Size > MaxSize {
		return nil, fmt.Errorf("size %d: want %d–%d bytes", f.Size, MinSize, MaxSize)
	}
	if f.VNI >= 1<<24 {
		return nil, fmt.Errorf("vni %d: want 0–%d (24 bits)", f.VNI, 1<<24-1)
	}
	b := make([]byte, f.Size-OuterOverhead)
	// RFC 7348 §5: flags (I set), 24 reserved bits, VNI, 8 reserved bits.
	b[0] = 0x08
	binary.BigEndian.PutUint32(b[4:], f.VNI<<8)
	eth := b[vxlanLen:]
	copy(eth[0:6], innerDstMAC[:])
	copy(eth[6:12], innerSrcMAC[:])
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	ip := eth[ethLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[8] = 1  // TTL: never routed further
	ip[9] = 17 // UDP
	src, dst := innerSrcIP.As4(), innerDstIP.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip[:ipLen]))
	udp := ip[ipLen:]
	binary.BigEndian.PutUint16(udp[0:], 9) // discard
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	// UDP checksum 0: none (IPv4 allows it).
	p := udp[udpLen:]
	copy(p[0:8], magic[:])
	p[8] = byte(f.Kind)
	binary.BigEndian.PutUint64(p[9:], f.Nonce)
	binary.BigEndian.PutUint32(p[17:], f.VNI)
	binary.BigEndian.PutUint16(p[21:], uint16(f.Size))
	binary.BigEndian.PutUint32(p[23:], f.Seq)
	return b, nil
}

// errNotProbe is a datagram that is not a probe frame.
var errNotProbe = errors.New("not a path probe frame")

// Unmarshal parses a UDP payload received on the port under test. It
// checks the VXLAN header (I flag; the VNI agrees with the one inside),
// the inner headers and that the datagram has the size it says.
func Unmarshal(b []byte) (Frame, error) {
	var f Frame
	if len(b) < MinSize-OuterOverhead {
		return f, fmt.Errorf("%w: %d bytes", errNotProbe, len(b))
	}
	if b[0]&0x08 == 0 {
		return f, fmt.Errorf("%w: VXLAN I flag not set", errNotProbe)
	}
	eth := b[vxlanLen:]
	ip := eth[ethLen:]
	p := ip[ipLen+udpLen:]
	if [6]byte(eth[0:6]) != innerDstMAC || binary.BigEndian.Uint16(eth[12:]) != 0x0800 || ip[9] != 17 || [8]byte(p[0:8]) != magic {
		return f, errNotProbe
	}
	f.Kind = Kind(p[8])
	f.Nonce = binary.BigEndian.Uint64(p[9:])
	f.VNI = binary.BigEndian.Uint32(p[17:])
	f.Size = int(binary.BigEndian.Uint16(p[21:]))
	f.Seq = binary.BigEndian.Uint32(p[23:])
	if outer := binary.BigEndian.Uint32(b[4:]) >> 8; outer != f.VNI {
		return f, fmt.Errorf("%w: VXLAN header VNI %d, inner says %d (rewritten on the way?)", errNotProbe, outer, f.VNI)
	}
	if f.Size != len(b)+OuterOverhead {
		return f, fmt.Errorf("%w: %d bytes, inner says %d (truncated on the way?)", errNotProbe, len(b)+OuterOverhead, f.Size)
	}
	if f.Kind != Request && f.Kind != Answer && f.Kind != Control {
		return f, fmt.Errorf("%w: kind %d", errNotProbe, f.Kind)
	}
	return f, nil
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
