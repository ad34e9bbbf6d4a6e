package machineconfig

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseMaxUnavailable reads --max-unavailable: a count ("1") or a
// percentage of the nodes rolled out ("25%"), like the pool's own
// spec.maxUnavailable. A percentage rounds down but never below one node,
// as the MCC's does; a zero value is refused, because it could never start.
func ParseMaxUnavailable(s string, nodes int) (int, error) {
	bad := func(why string) error {
		return fmt.Errorf("--max-unavailable %q: %s (want a count such as 1 or a percentage such as 25%%)", s, why)
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.Atoi(p)
		switch {
		case err != nil:
			return 0, bad("not a percentage")
		case n <= 0:
			return 0, bad("must be more than 0%: no node could ever start")
		case n > 100:
			return 0, bad("more than 100%")
		}
		return max(1, nodes*n/100), nil
	}
	n, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return 0, bad("not a number")
	case n <= 0:
		return 0, bad("must be at least 1: no node could ever start")
	}
	return n, nil
}
