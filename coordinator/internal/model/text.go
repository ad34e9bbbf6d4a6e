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

// SetOf is ns as a set: the lookups here run over every node of a large
// cluster, where a scan per node would be quadratic.
func SetOf(ns []string) map[string]bool {
	m := make(map[string]bool, len(ns))
	for _, n := range ns {
		m[n] = true
	}
	return m
}
