package udpport

import (
	"testing"
)

func TestHolderString(t *testing.T) {
	for _, tc := range []struct {
		h    Holder
		want string
	}{
		{Holder{}, "nothing"},
		{Holder{Kind: "socket", Inode: 18617, Local: "0.0.0.0:4789"}, "socket inode 18617 (0.0.0.0:4789)"},
		{Holder{Kind: "vxlan", Device: "flannel.1"}, "vxlan device flannel.1"},
	} {
		if got := tc.h.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.h, got, tc.want)
		}
	}
}

func TestFake(t *testing.T) {
	f := &Fake{}
	f.Hold(4789, Holder{Kind: "vxlan", Device: "vxlan0"})
	if free, h, err := f.Free(4789); err != nil || free || h.Device != "vxlan0" {
		t.Errorf("Free(4789) = %v, %v, %v; want held by vxlan0", free, h, err)
	}
	if free, _, err := f.Free(4889); err != nil || !free {
		t.Errorf("Free(4889) = %v, %v; want free", free, err)
	}
	if _, _, err := f.Free(0); err == nil {
		t.Error("Free(0) accepted")
	}
	if _, _, err := Free(nil, 4789); err == nil {
		t.Error("nil handle accepted")
	}
}
