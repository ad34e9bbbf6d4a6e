package staging

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Held is a held operation, as a continuation decides from it: a staged
// subset switched some of its nodes (Switched) and every node listens on
// both ports.
type Held struct {
	ID       string
	From, To tunnelport.Port
	Nodes    []string // the operation's nodes, sorted
	Switched []string // those that send To
}

// Ask is what a continuation of a held operation asks.
type Ask struct {
	OperationID string   // "" or the held operation's
	Subset      bool     // Targets were named (--nodes/--selector)
	Targets     []string // resolved against the inventory
	Inventory   []string // every node of the inventory today
}

// Continue decides which nodes a continuation of h switches: the asked
// targets, or every node still listening when none was named. It refuses,
// changing nothing, when the inventory drifted since h was held (a node
// that joined never listened on the new port: switching more senders
// would cut it off; one that left cannot be switched), when the request
// names another operation, or when a target is not h's or already
// switched. Pure.
func Continue(h Held, a Ask) ([]string, error) {
	if joined, left := Drift(a.Inventory, h.Nodes); len(joined)+len(left) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"operation %s is held over %d nodes but the inventory changed since (joined: %s; left: %s): a node that joined does not listen on %d; roll the held operation back (coordctl rollback %s) and run the change again over the nodes of today",
			h.ID, len(h.Nodes), listOrNone(joined), listOrNone(left), h.To, h.ID)
	}
	if a.OperationID != "" && a.OperationID != h.ID {
		return nil, model.Invalid("operation_id", fmt.Sprintf("%q", a.OperationID), fmt.Sprintf("operation %s is held and this request continues it: drop operation_id or give %s", h.ID, h.ID))
	}
	sw := model.SetOf(h.Switched)
	var listening []string
	for _, n := range h.Nodes {
		if !sw[n] {
			listening = append(listening, n)
		}
	}
	if !a.Subset {
		return listening, nil
	}
	var foreign, already, targets []string
	of := model.SetOf(h.Nodes)
	for _, n := range a.Targets {
		switch {
		case !of[n]:
			foreign = append(foreign, n)
		case sw[n]:
			already = append(already, n)
		default:
			targets = append(targets, n)
		}
	}
	if len(foreign) > 0 {
		return nil, model.Invalid("nodes", strings.Join(foreign, ","), fmt.Sprintf("not nodes of held operation %s (%d nodes: %s): it can only switch its own", h.ID, len(h.Nodes), model.Abbreviate(h.Nodes, 10)))
	}
	if len(targets) == 0 {
		return nil, model.Invalid("nodes", strings.Join(already, ","), fmt.Sprintf("already send port %d in held operation %s: nothing to switch; still on port %d: %s", h.To, h.ID, h.From, model.Abbreviate(listening, 10)))
	}
	return targets, nil
}

// Drift is which of inv are not in opNodes (joined) and which of opNodes
// are not in inv (left), each sorted.
func Drift(inv, opNodes []string) (joined, left []string) {
	in, of := model.SetOf(inv), model.SetOf(opNodes)
	for _, n := range opNodes {
		if !in[n] {
			left = append(left, n)
		}
	}
	for _, n := range inv {
		if !of[n] {
			joined = append(joined, n)
		}
	}
	slices.Sort(joined)
	slices.Sort(left)
	return joined, left
}

func listOrNone(ns []string) string {
	if len(ns) == 0 {
		return "none"
	}
	return model.Abbreviate(ns, 10)
}
