// Package tunnelport is the overlay's UDP tunnel port as one type: its
// range check, its parsing from flags, requests and cluster objects, and the
// well-known ports of other tunnels that a change must not take by accident.
// Before it, every layer (CLI, coordinator, flannel and Calico sources of
// truth, the ClusterNetwork, OVS) checked 1–65535 in its own words.
//
// The package is pure: no I/O. Whether a port is free on a node is
// pkg/udpport's question.
package tunnelport

import (
	"fmt"
	"strconv"
	"strings"
)

// Port is a UDP port a tunnel sends to and listens on: 1–65535.
type Port uint16

// Well-known tunnel ports.
const (
	VXLAN   Port = 4789 // IANA VXLAN: NSX, OVS and most VXLAN stacks
	Geneve  Port = 6081 // Geneve: OVN
	Flannel Port = 8472 // the Linux kernel's and flannel's VXLAN default
)

// WellKnown names the tunnels whose default port each well-known port is.
var WellKnown = map[Port]string{
	VXLAN:   "IANA VXLAN (NSX and most VXLAN stacks)",
	Geneve:  "Geneve (OVN)",
	Flannel: "Linux/flannel VXLAN default",
}

// Error is a value that is not a tunnel port. Field names where it came
// from (a flag, a request field, an object's field) so the message says
// what to fix.
type Error struct {
	Field  string
	Value  string
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s: %s", e.Field, e.Value, e.Reason) }

const want = "want a UDP port 1-65535"

// From checks a number from a wire or an object: 0 means not set.
func From(field string, n int64) (Port, error) {
	switch {
	case n == 0:
		return 0, &Error{Field: field, Value: "0", Reason: "not set: " + want}
	case n < 1 || n > 65535:
		return 0, &Error{Field: field, Value: strconv.FormatInt(n, 10), Reason: "out of range: " + want}
	}
	return Port(n), nil
}

// Parse reads a port written by a person (a flag): decimal, surrounding
// blanks ignored.
func Parse(field, s string) (Port, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, &Error{Field: field, Value: strconv.Quote(s), Reason: "empty: " + want}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, &Error{Field: field, Value: strconv.Quote(s), Reason: "not a whole number: " + want}
	}
	if n < 1 || n > 65535 {
		return 0, &Error{Field: field, Value: strconv.Quote(s), Reason: "outside 1-65535, the range of UDP ports"}
	}
	return Port(n), nil
}

func (p Port) String() string { return strconv.Itoa(int(p)) }

// Wire is p as the gRPC messages carry a port (uint32 fields): for a
// request, or to compare with a port an agent reported. A port read from
// a message becomes a Port through From, which checks its range.
func (p Port) Wire() uint32 { return uint32(p) }
