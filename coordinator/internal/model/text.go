package model

import (
	"fmt"
	"strings"
)

// Abbreviate lists ss comma-separated, the first n of them and how many
// more: every message that names nodes names them so, whatever their count.
func Abbreviate(ss []string, n int) string {
	if len(ss) <= n {
		return strings.Join(ss, ",")
	}
	return strings.Join(ss[:n], ",") + fmt.Sprintf(",… (%d more)", len(ss)-n)
}
