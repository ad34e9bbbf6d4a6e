package coordinator

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// FuzzCutoverRequestValidation feeds arbitrary CutoverRequests to the
// coordinator's validation. It must never panic; a refusal is
// INVALID_ARGUMENT naming the field; an accepted request has a port in
// 1–65535 outside the refused ranges, a positive step deadline (no
// overflow of timeout_millis) and only inventory nodes.
func FuzzCutoverRequestValidation(f *testing.F) {
	f.Add(uint32(4889), "", "", int64(0), false, false, "")
	f.Add(uint32(0), "n1,n9", "a=b", int64(-1), false, false, "bad id")
	f.Add(uint32(30080), "", "lab=x", int64(1500), true, true, "op-1")
	f.Add(uint32(6081), "n1", "", int64(9223372036855), false, true, "") // overflows a Duration
	f.Add(uint32(70000), "", "", int64(1<<62), false, false, strings.Repeat("a", 100))
	cfg := Default()
	cfg.Insecure = true
	cfg.StateDir = f.TempDir()
	inv := Inventory{Agents: []AgentSpec{{Node: "n1", Address: "198.18.128.11:9443"}, {Node: "n2", Address: "198.18.128.12:9443"}}}
	c, err := New(cfg, inv)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(c.Close)
	f.Fuzz(func(t *testing.T, port uint32, nodes, selector string, timeoutMillis int64, allowNP, allowTunnel bool, id string) {
		req := &coordinatorv1.CutoverRequest{Port: port, Selector: selector, TimeoutMillis: timeoutMillis,
			AllowNodeportRange: allowNP, AllowTunnelPort: allowTunnel, OperationId: id}
		if nodes != "" {
			req.Nodes = strings.Split(nodes, ",")
		}
		r, err := c.check.Validate(req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("refusal is %v, want InvalidArgument", err)
			}
			return
		}
		switch {
		case port < 1 || port > 65535:
			t.Fatalf("port %d accepted", port)
		case r.Step <= 0:
			t.Fatalf("timeout_millis %d accepted as step deadline %s", timeoutMillis, r.Step)
		case len(r.Nodes) == 0:
			t.Fatalf("no target nodes for %+v", req)
		}
		for _, n := range r.Nodes {
			if n != "n1" && n != "n2" {
				t.Fatalf("node %q accepted", n)
			}
		}
	})
}
