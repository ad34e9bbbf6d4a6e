package agentv1

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A late refusal carries its lateness through a status; an ABORTED without
// the detail, or another code, is no late refusal.
func TestLateStatusRoundTrip(t *testing.T) {
	err := LateStatus("operation op1: commit late by 912ms (lateness budget 200ms): not applied", 912*time.Millisecond)
	if status.Code(err) != codes.Aborted {
		t.Fatalf("code %s, want Aborted", status.Code(err))
	}
	if d, ok := LatenessOf(err); !ok || d != 912*time.Millisecond {
		t.Fatalf("LatenessOf = %s %t, want 912ms true", d, ok)
	}
	for _, e := range []error{status.Error(codes.Aborted, "commit late by 912ms"), status.Error(codes.Internal, "x"), nil} {
		if d, ok := LatenessOf(e); ok {
			t.Errorf("LatenessOf(%v) = %s, true: not a late refusal", e, d)
		}
	}
}
