package model

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Strategies, as CutoverRequest.strategy spells them.
const (
	StrategyAtomic = "atomic"
	StrategyStaged = "staged"
	// StrategyAuto is resolved before preflight (the coordinator resolves it): the report
	// and the journal name the strategy that ran.
	StrategyAuto = "auto"
)

// Invalid is an InvalidArgument naming field, value and reason: every
// refusal of a request says what was wrong, with which value, and why.
func Invalid(field string, value any, reason string) error {
	return status.Errorf(codes.InvalidArgument, "%s %v: %s", field, value, reason)
}
