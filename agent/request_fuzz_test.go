package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// FuzzRequestValidation feeds arbitrary Prepare and Commit requests to a
// service whose backend is not up: whatever validation lets through must
// reach the backend check (UNAVAILABLE), and whatever it refuses must be
// INVALID_ARGUMENT naming the field. It also pins the arithmetic: a
// deadman_millis or at_unix_nano that overflows a time.Duration must be
// refused, never wrapped into a small (or negative) dead-man.
func FuzzRequestValidation(f *testing.F) {
	f.Add("op-1", uint32(4789), uint32(4889), int64(0), int64(0))
	f.Add("", uint32(0), uint32(70000), int64(-1), int64(-1))
	f.Add("a/b", uint32(4789), uint32(4789), int64(1), int64(3600001))
	f.Add("op-2", uint32(1), uint32(65535), int64(0), int64(9223372036855))  // deadman overflows int64 ns
	f.Add("op-3", uint32(1), uint32(65535), int64(0), int64(18446744073710)) // wraps to ~1 ms
	f.Add(strings.Repeat("x", 200), uint32(1), uint32(2), int64(1<<62), int64(5))
	cfg := Default()
	cfg.NodeName = "n1"
	s := NewService(cfg, nil, nil, nil)
	f.Fuzz(func(t *testing.T, id string, from, to uint32, at, deadmanMillis int64) {
		ctx := context.Background()
		_, err := s.Prepare(ctx, &agentv1.PrepareRequest{OperationId: id, FromPort: from, ToPort: to})
		checkValidation(t, "prepare", err)
		if err == nil {
			t.Fatal("prepare succeeded without a backend")
		}
		_, err = s.Commit(ctx, &agentv1.CommitRequest{OperationId: id, AtUnixNano: at, DeadmanMillis: deadmanMillis})
		checkValidation(t, "commit", err)
		if status.Code(err) == codes.Unavailable && deadmanMillis > 0 && deadmanMillis > cfg.MaxDeadman.Milliseconds() {
			t.Fatalf("commit: deadman_millis %d (> --max-deadman %s) accepted", deadmanMillis, cfg.MaxDeadman)
		}
		if status.Code(err) == codes.Unavailable && at > 0 && time.Until(time.Unix(0, at)) > cfg.MaxCommitDelay {
			t.Fatalf("commit: at_unix_nano %d beyond --max-commit-delay accepted", at)
		}
	})
}

func checkValidation(t *testing.T, what string, err error) {
	t.Helper()
	switch status.Code(err) {
	case codes.Unavailable: // passed validation, stopped at the backend
	case codes.InvalidArgument:
		msg := status.Convert(err).Message()
		named := strings.Contains(msg, "operation_id") || strings.Contains(msg, "port") ||
			strings.Contains(msg, "at_unix_nano") || strings.Contains(msg, "deadman")
		if !strings.Contains(msg, ":") || !named {
			t.Fatalf("%s: InvalidArgument does not name the field: %q", what, msg)
		}
	default:
		t.Fatalf("%s: unexpected %v", what, err)
	}
}
