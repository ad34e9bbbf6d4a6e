package config

import (
	"strings"
	"testing"
)

func TestListenAddrs(t *testing.T) {
	c := Default()
	c.Listen = "198.18.128.1:9446, unix:/run/cutover/c.sock,unix:///tmp/x.sock"
	got, err := c.ListenAddrs()
	if err != nil {
		t.Fatal(err)
	}
	want := []ListenAddr{{"tcp", "198.18.128.1:9446"}, {"unix", "/run/cutover/c.sock"}, {"unix", "/tmp/x.sock"}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"unix:", "9446", "host:9446,", "unix:/"} {
		c.Listen = bad
		if _, err := c.ListenAddrs(); err == nil || !strings.Contains(err.Error(), "--listen") {
			t.Errorf("--listen %q: %v, want an error naming --listen", bad, err)
		}
	}
}
