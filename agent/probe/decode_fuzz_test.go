package probe

import (
	"bytes"
	"testing"
)

// Anyone on the overlay can send the mesh a datagram: decode must never
// panic, must accept only the three kinds at their lengths, and what it
// accepts must encode back to the same bytes (nothing read is dropped or
// made up).
func FuzzDecode(f *testing.F) {
	var b [packetSize + maxRiding*answerSize]byte
	for _, p := range []packet{
		{kind: kindReq, seq: 1, ts: 2 | rides},
		{kind: kindResp, seq: 1, ts: 2},
		{kind: kindReqResp, seq: 1, ts: 2 | rides, nAns: 2, ans: [maxRiding]echo{{3, 4}, {5, 6}}},
	} {
		n := encode(b[:], p)
		f.Add(append([]byte(nil), b[:n]...))
	}
	f.Add([]byte("CUTP"))
	f.Fuzz(func(t *testing.T, in []byte) {
		p, ok := decode(in)
		if !ok {
			return
		}
		if p.kind != kindReq && p.kind != kindResp && p.kind != kindReqResp {
			t.Fatalf("decoded kind %d", p.kind)
		}
		if (p.kind == kindReqResp) != (p.nAns > 0) || p.nAns > maxRiding {
			t.Fatalf("kind %d with %d answers", p.kind, p.nAns)
		}
		var out [packetSize + maxRiding*answerSize]byte
		if n := encode(out[:], p); !bytes.Equal(out[:n], in) {
			t.Fatalf("decode(%x) = %+v encodes to %x", in, p, out[:n])
		}
	})
}
