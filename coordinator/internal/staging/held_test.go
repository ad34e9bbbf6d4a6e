package staging

import (
	"slices"
	"strings"
	"testing"
)

// TestContinue: every branch of a held operation's continuation, each
// refusal naming what to fix.
func TestContinue(t *testing.T) {
	h := Held{ID: "op1", From: 4789, To: 4889, Nodes: []string{"n1", "n2", "n3", "n4"}, Switched: []string{"n1"}}
	inv := []string{"n1", "n2", "n3", "n4"}
	for _, tc := range []struct {
		name string
		ask  Ask
		want []string
		err  string
	}{
		{"no targets: every node still listening", Ask{Inventory: inv}, []string{"n2", "n3", "n4"}, ""},
		{"named targets", Ask{Inventory: inv, Subset: true, Targets: []string{"n3"}}, []string{"n3"}, ""},
		{"its own id", Ask{OperationID: "op1", Inventory: inv}, []string{"n2", "n3", "n4"}, ""},
		{"another id", Ask{OperationID: "op2", Inventory: inv}, nil, `operation_id "op2": operation op1 is held`},
		{"a node joined", Ask{Inventory: append(slices.Clone(inv), "n5")}, nil, "inventory changed since (joined: n5; left: none)"},
		{"a node left", Ask{Inventory: inv[:3]}, nil, "(joined: none; left: n4)"},
		{"a foreign target", Ask{Inventory: inv, Subset: true, Targets: []string{"n2", "n9"}}, nil, "nodes n9: not nodes of held operation op1"},
		{"only switched targets", Ask{Inventory: inv, Subset: true, Targets: []string{"n1"}}, nil, "nodes n1: already send port 4889 in held operation op1: nothing to switch; still on port 4789: n2,n3,n4"},
	} {
		got, err := Continue(h, tc.ask)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, tc.err)
		case !slices.Equal(got, tc.want):
			t.Errorf("%s: targets %v, want %v", tc.name, got, tc.want)
		}
	}
}
