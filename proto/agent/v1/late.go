package agentv1

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A Commit the agent refused because it reached the commit instant past the
// lateness budget (CommitRequest.late_budget_millis) answers ABORTED with a
// google.rpc.ErrorInfo of this reason, whose metadata says how late it was:
// the coordinator reports the node late by that, not only as a failed call.
const (
	LateReason   = "COMMIT_LATE"
	LateDomain   = "cutover.dev"
	LateNanosKey = "lateness_nanos"
)

// LateStatus is the status of such a refusal: ABORTED, msg, and the
// ErrorInfo carrying late.
func LateStatus(msg string, late time.Duration) error {
	st := status.New(codes.Aborted, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: LateReason, Domain: LateDomain,
		Metadata: map[string]string{LateNanosKey: strconv.FormatInt(late.Nanoseconds(), 10)}}); err == nil {
		st = d
	}
	return st.Err()
}

// LatenessOf is how late the agent said it was, when err is such a
// refusal.
func LatenessOf(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Aborted {
		return 0, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == LateReason && info.GetDomain() == LateDomain {
			n, err := strconv.ParseInt(info.GetMetadata()[LateNanosKey], 10, 64)
			if err != nil {
				return 0, false
			}
			return time.Duration(n), true
		}
	}
	return 0, false
}
