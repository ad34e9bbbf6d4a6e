package netlinksafe

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

// fakeDump returns ErrDumpInterrupted (with a partial result, as netlink
// v1.3 does) for the first n calls, then the full result.
type fakeDump struct {
	interrupted int
	calls       int
	other       error
}

func (f *fakeDump) dump() ([]string, error) {
	f.calls++
	if f.other != nil {
		return nil, f.other
	}
	if f.calls <= f.interrupted {
		return []string{"partial"}, fmt.Errorf("wrapped: %w", netlink.ErrDumpInterrupted)
	}
	return []string{"a", "b"}, nil
}

func TestRetry(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name        string
		interrupted int
		other       error
		wantCalls   int
		wantLen     int
		wantErr     error
	}{
		{"clean first time", 0, nil, 1, 2, nil},
		{"interrupted twice then clean", 2, nil, 3, 2, nil},
		{"interrupted on the last allowed try then clean", Attempts - 1, nil, Attempts, 2, nil},
		{"always interrupted", 100, nil, Attempts, 0, netlink.ErrDumpInterrupted},
		{"other error is not retried", 0, boom, 1, 0, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeDump{interrupted: tc.interrupted, other: tc.other}
			got, err := Retry(Attempts, "test dump", f.dump)
			if f.calls != tc.wantCalls {
				t.Errorf("calls = %d, want %d", f.calls, tc.wantCalls)
			}
			if len(got) != tc.wantLen {
				t.Errorf("result = %v, want %d entries (never a partial one)", got, tc.wantLen)
			}
			if tc.wantErr == nil && err != nil {
				t.Errorf("err = %v, want nil", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want one wrapping %v", err, tc.wantErr)
			}
		})
	}
}

func TestRetryAtLeastOnce(t *testing.T) {
	f := &fakeDump{}
	if _, err := Retry(0, "test dump", f.dump); err != nil || f.calls != 1 {
		t.Fatalf("Retry(0) = %v after %d calls, want success after 1", err, f.calls)
	}
}
