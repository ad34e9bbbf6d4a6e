package openflow

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Fake is an in-memory Interface. It validates like Client, stores flows
// normalized as ovs-ofctl prints them, applies OpenFlow add/delete semantics
// for the fields the product writes, and Dump prints CanonicalDump text.
type Fake struct {
	// Hook, when set, runs before every operation (op is the method name);
	// a non-nil return fails it without changing anything.
	Hook func(op, bridge string) error

	mu      sync.Mutex
	bridges map[string][]Flow
}

var _ Interface = (*Fake)(nil)

// NewFake returns a fake holding the given bridges, each empty.
func NewFake(bridges ...string) *Fake {
	f := &Fake{bridges: map[string][]Flow{}}
	for _, b := range bridges {
		f.bridges[b] = nil
	}
	return f
}

func (f *Fake) begin(op, bridge string) error {
	if err := validBridge(bridge); err != nil {
		return err
	}
	if f.Hook != nil {
		if err := f.Hook(op, bridge); err != nil {
			return &execseam.Error{Argv: []string{"fake", op, bridge}, Err: err}
		}
	}
	if _, ok := f.bridges[bridge]; !ok {
		return &execseam.Error{Argv: []string{"fake", op, bridge}, Output: bridge + " is not a bridge", Err: fmt.Errorf("%w: %s", ErrBridgeNotFound, bridge)}
	}
	return nil
}

func sameKey(a, b Flow) bool {
	if a.Table != b.Table || a.Priority != b.Priority || len(a.Match) != len(b.Match) {
		return false
	}
	for _, m := range a.Match {
		if !slices.Contains(b.Match, m) {
			return false
		}
	}
	return true
}

// AddFlow adds fl or replaces the flow with the same table, priority and match.
func (f *Fake) AddFlow(_ context.Context, bridge string, fl Flow) error {
	if err := fl.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("AddFlow", bridge); err != nil {
		return err
	}
	n := fl.Normalize()
	flows := f.bridges[bridge]
	if i := slices.IndexFunc(flows, func(x Flow) bool { return sameKey(x, n) }); i >= 0 {
		flows[i] = n
		return nil
	}
	f.bridges[bridge] = append(flows, n)
	return nil
}

// DelFlows deletes non-strictly by match.
func (f *Fake) DelFlows(_ context.Context, bridge string, match Flow) error {
	if err := validDelete(bridge, match); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("DelFlows", bridge); err != nil {
		return err
	}
	m := match.Normalize()
	f.bridges[bridge] = slices.DeleteFunc(f.bridges[bridge], func(x Flow) bool {
		return x.Table == m.Table && (m.Cookie == 0 || x.Cookie == m.Cookie) && covers(m.Match, x.Match)
	})
	return nil
}

// AddFlows is AddFlow for each flow, all or nothing on validation.
func (f *Fake) AddFlows(ctx context.Context, bridge string, flows []Flow) error {
	for _, fl := range flows {
		if err := fl.Validate(); err != nil {
			return err
		}
	}
	for _, fl := range flows {
		if err := f.AddFlow(ctx, bridge, fl); err != nil {
			return err
		}
	}
	return nil
}

// DelFlowStrict deletes the flow with exactly fl's table, priority and match.
func (f *Fake) DelFlowStrict(_ context.Context, bridge string, fl Flow) error {
	if err := validDelete(bridge, fl); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("DelFlowStrict", bridge); err != nil {
		return err
	}
	n := fl.Normalize()
	f.bridges[bridge] = slices.DeleteFunc(f.bridges[bridge], func(x Flow) bool {
		return sameKey(x, n) && (n.Cookie == 0 || x.Cookie == n.Cookie)
	})
	return nil
}

// DumpFlows returns the bridge's flows (normalized, in insertion order).
func (f *Fake) DumpFlows(_ context.Context, bridge string) ([]Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("DumpFlows", bridge); err != nil {
		return nil, err
	}
	out := make([]Flow, len(f.bridges[bridge]))
	for i, x := range f.bridges[bridge] {
		x.Match = slices.Clone(x.Match)
		out[i] = x
	}
	return out, nil
}

// DumpBridge prints one bridge's flows as CanonicalDump.
func (f *Fake) DumpBridge(bridge string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return CanonicalDump(f.bridges[bridge])
}

// Dump prints every bridge, sorted by name, as "bridge <name>:" followed by
// its CanonicalDump.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.bridges))
	for b := range f.bridges {
		names = append(names, b)
	}
	slices.Sort(names)
	var s string
	for _, b := range names {
		s += "bridge " + b + ":\n" + CanonicalDump(f.bridges[b])
	}
	return s
}
