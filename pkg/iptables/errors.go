package iptables

import (
	"errors"
	"fmt"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"
)

// ErrNotFound marks a missing chain (or, for DeleteRule's strict cousins, a
// missing rule). Test with IsNotFound.
var ErrNotFound = errors.New("no such chain or rule")

// Error is a failed iptables operation: what was attempted, the argv that ran
// (or would have run, for the fake) and the cause.
type Error struct {
	Op   string   // "ensure rule", "list rules", ...
	Argv []string // e.g. [iptables-nft -t filter -A OS_FIREWALL_ALLOW -p udp ...]
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("iptables %s: %s: %v", e.Op, strings.Join(e.Argv, " "), e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// IsNotFound reports whether err says a chain (or rule) does not exist, from
// the real backends or the fake.
func IsNotFound(err error) bool {
	if errors.Is(err, ErrNotFound) {
		return true
	}
	var ie *goipt.Error
	return errors.As(err, &ie) && ie.IsNotExist()
}

// IsValidation reports whether err is bad input (a ValidationError): nothing
// was run.
func IsValidation(err error) bool {
	var ve *ValidationError
	return errors.As(err, &ve)
}
