package tunnelport_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    tunnelport.Port
		wantErr string
	}{
		{"4889", 4889, ""},
		{" 1 ", 1, ""},
		{"65535", 65535, ""},
		{"", 0, `--port "": empty`},
		{"0", 0, `--port "0": outside 1-65535`},
		{"65536", 0, `--port "65536": outside 1-65535`},
		{"-1", 0, `--port "-1": outside`},
		{"48x9", 0, `--port "48x9": not a whole number`},
		{"99999999999999999999", 0, "not a whole number"},
	} {
		got, err := tunnelport.Parse("--port", c.in)
		if c.wantErr == "" {
			if err != nil || got != c.want {
				t.Errorf("Parse(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			continue
		}
		var pe *tunnelport.Error
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), c.wantErr) || got != 0 {
			t.Errorf("Parse(%q) = %v, %v; want an *Error containing %q", c.in, got, err, c.wantErr)
		}
	}
}

func TestFrom(t *testing.T) {
	if p, err := tunnelport.From("port", 4889); err != nil || p != 4889 {
		t.Fatalf("From(4889) = %v, %v", p, err)
	}
	for n, want := range map[int64]string{0: "port 0: not set", 65536: "port 65536: out of range", -5: "port -5: out of range"} {
		if _, err := tunnelport.From("port", n); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("From(%d) = %v; want %q", n, err, want)
		}
	}
}

func TestWellKnown(t *testing.T) {
	for _, p := range []tunnelport.Port{tunnelport.VXLAN, tunnelport.Geneve, tunnelport.Flannel} {
		if tunnelport.WellKnown[p] == "" {
			t.Errorf("%v has no name", p)
		}
	}
}
