package conntrack

import (
	"errors"
	"testing"
)

func TestFakeDeletesOnlyUDPToPort(t *testing.T) {
	f := &Fake{Flows: []Flow{
		{"udp", "198.18.0.1", "198.18.0.2", 40000, 4789},
		{"udp", "::1", "::1", 40001, 4789},
		{"udp", "198.18.0.1", "198.18.0.2", 4789, 53},
		{"tcp", "198.18.0.1", "198.18.0.2", 40002, 4789},
		{"udp", "198.18.0.1", "198.18.0.2", 40003, 4889},
	}}
	n, err := f.DeleteUDPDstPort(4789)
	if err != nil || n != 2 {
		t.Fatalf("DeleteUDPDstPort(4789) = %d, %v; want 2, nil", n, err)
	}
	want := "tcp src=198.18.0.1 dst=198.18.0.2 sport=40002 dport=4789\n" +
		"udp src=198.18.0.1 dst=198.18.0.2 sport=40003 dport=4889\n" +
		"udp src=198.18.0.1 dst=198.18.0.2 sport=4789 dport=53\n"
	if got := f.Dump(); got != want {
		t.Fatalf("dump after delete:\n%s\nwant:\n%s", got, want)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := DeleteUDPDstPort(nil, 4789); err == nil {
		t.Error("nil handle accepted")
	}
	if _, err := (&Fake{}).DeleteUDPDstPort(0); err == nil {
		t.Error("port 0 accepted by the fake")
	}
	boom := errors.New("boom")
	f := &Fake{Err: boom}
	if _, err := f.DeleteUDPDstPort(4789); !errors.Is(err, boom) {
		t.Errorf("injected error = %v, want boom", err)
	}
}
