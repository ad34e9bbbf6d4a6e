package vxlan_test

import (
	"testing"

	"github.com/cutover-dev/cutover/harness/vxlantest"
)

// node is one side of the two-namespace lab (harness/vxlantest), set up
// with ip(8) and bridge(8) so that the driver reads a state it did not make
// itself; node.Kernel is the driver opened in its namespace.
type node = vxlantest.Node

const (
	dev = "vx0"
	vni = 42
)

// newLab makes two namespaces joined by a veth pair, each with vx0 on port,
// VNI 42, nolearning, the flood entry and the peer's MAC in the FDB, a
// permanent neighbour for the peer and a route to 198.18.101.0/24 via it.
func newLab(t testing.TB, port int) (a, b *node) {
	t.Helper()
	return vxlantest.New(t, vxlantest.Config{Prefix: "cot-vxlan", Device: dev, VNI: vni, Port: port})
}
