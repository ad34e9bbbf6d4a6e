package ovsdb

import (
	"errors"
	"fmt"
)

// OpError is an operation of a transaction that failed; the operations
// before it had no effect either (the transaction is atomic).
type OpError struct {
	Index   int    // position of the failed op in the transaction
	Op      string // its op, e.g. "wait"
	Err     string // RFC 7047 error string, e.g. "timed out", "constraint violation"
	Details string
}

func (e *OpError) Error() string {
	if e.Details != "" {
		return fmt.Sprintf("ovsdb: op %d (%s): %s: %s", e.Index, e.Op, e.Err, e.Details)
	}
	return fmt.Sprintf("ovsdb: op %d (%s): %s", e.Index, e.Op, e.Err)
}

// TransactError is a transaction that failed as a whole: every op passed but
// the commit did not (the RFC's extra trailing error element), or the server
// answered the transact with a JSON-RPC error, or the result was malformed.
type TransactError struct {
	Err     string
	Details string
}

func (e *TransactError) Error() string {
	if e.Details != "" {
		return fmt.Sprintf("ovsdb: transaction failed: %s: %s", e.Err, e.Details)
	}
	return "ovsdb: transaction failed: " + e.Err
}

// RPCError is a JSON-RPC error answer to a call other than transact.
type RPCError struct {
	Method string
	Err    string
}

func (e *RPCError) Error() string { return fmt.Sprintf("ovsdb: %s: %s", e.Method, e.Err) }

// ErrClosed is returned for calls on, or pending on, a closed connection.
var ErrClosed = errors.New("ovsdb: connection closed")

// errString returns the RFC error string of an OpError or TransactError.
func errString(err error) string {
	var oe *OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	var te *TransactError
	if errors.As(err, &te) {
		return te.Err
	}
	return ""
}

// IsWaitFailed reports whether a transaction failed because a wait op's
// condition did not hold within its timeout (compare-and-set lost).
func IsWaitFailed(err error) bool {
	var oe *OpError
	return errors.As(err, &oe) && oe.Op == "wait" && oe.Err == "timed out"
}

// IsConstraintViolation reports a schema constraint violated by an op or at
// commit (e.g. a duplicate index value, a set size out of bounds).
func IsConstraintViolation(err error) bool { return errString(err) == "constraint violation" }

// IsReferentialIntegrityViolation reports a commit refused for a dangling
// strong reference.
func IsReferentialIntegrityViolation(err error) bool {
	return errString(err) == "referential integrity violation"
}

// IsClosed reports whether err is due to the connection being closed.
func IsClosed(err error) bool { return errors.Is(err, ErrClosed) }
