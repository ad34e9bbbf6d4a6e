package model

import (
	"context"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// VerifyInput is what a Verifier is told about the committed operation.
type VerifyInput struct {
	OperationID string
	FromPort    tunnelport.Port
	ToPort      tunnelport.Port
	Nodes       []string
}

// Verifier is an extra, operation-wide check run after every node's
// read-back passed (the lab's probe-mesh check, say). A non-nil error
// fails verification and rolls the operation back; its message goes into
// the report.
type Verifier interface {
	Verify(ctx context.Context, in VerifyInput) error
}

// VerifierFunc adapts a function to Verifier.
type VerifierFunc func(ctx context.Context, in VerifyInput) error

// Verify implements Verifier.
func (f VerifierFunc) Verify(ctx context.Context, in VerifyInput) error { return f(ctx, in) }
