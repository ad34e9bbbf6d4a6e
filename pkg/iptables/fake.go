package iptables

import (
	"fmt"
	"slices"
	"sync"
)

// Fake is an in-memory Interface for unit tests of the logic above the
// driver. It validates input exactly as Client does, stores rules as their
// iptables-save lines, and Dump prints the state canonically so tests compare
// text.
type Fake struct {
	// Hook, when set, runs before every operation; a non-nil return fails it
	// (to test how callers handle a failing firewall). op is the Interface
	// method name.
	Hook func(op, table, chain string) error

	mu      sync.Mutex
	backend string
	tables  map[string]*fakeTable
}

type fakeTable struct {
	chains []string            // user chains in creation order
	rules  map[string][]string // chain -> "-A ..." lines
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty fake reporting backend (BackendNFT if empty).
func NewFake(backend string) *Fake {
	if backend == "" {
		backend = BackendNFT
	}
	return &Fake{backend: backend, tables: map[string]*fakeTable{}}
}

// Backend reports the backend given to NewFake.
func (f *Fake) Backend() string { return f.backend }

func (f *Fake) table(name string) *fakeTable {
	t := f.tables[name]
	if t == nil {
		t = &fakeTable{rules: map[string][]string{}}
		f.tables[name] = t
	}
	return t
}

func (f *Fake) chainExists(table, chain string) bool {
	if slices.Contains(builtinChains[table], chain) {
		return true
	}
	t := f.tables[table]
	return t != nil && slices.Contains(t.chains, chain)
}

func (f *Fake) hook(op, table, chain string) error {
	if f.Hook == nil {
		return nil
	}
	if err := f.Hook(op, table, chain); err != nil {
		return &Error{Op: op, Argv: []string{"fake", "-t", table, chain}, Err: err}
	}
	return nil
}

func notFound(op, table, chain string, argv ...string) error {
	return &Error{
		Op:   op,
		Argv: append([]string{"fake", "-t", table}, argv...),
		Err:  fmt.Errorf("%w: chain %s in table %s", ErrNotFound, chain, table),
	}
}

// EnsureChain creates the chain if absent.
func (f *Fake) EnsureChain(table, chain string) error {
	if err := validChain(table, chain); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("EnsureChain", table, chain); err != nil {
		return err
	}
	t := f.table(table)
	if !f.chainExists(table, chain) {
		t.chains = append(t.chains, chain)
	}
	return nil
}

// EnsureRule inserts r at the top of its chain if absent (as the real one); the chain must exist.
func (f *Fake) EnsureRule(r Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("EnsureRule", r.Table, r.Chain); err != nil {
		return err
	}
	if !f.chainExists(r.Table, r.Chain) {
		return notFound("ensure rule", r.Table, r.Chain, "-I", r.String())
	}
	t := f.table(r.Table)
	line := r.String()
	if !slices.Contains(t.rules[r.Chain], line) {
		t.rules[r.Chain] = append([]string{line}, t.rules[r.Chain]...) // -I chain 1, as the real one
	}
	return nil
}

// DeleteRule deletes r if present.
func (f *Fake) DeleteRule(r Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("DeleteRule", r.Table, r.Chain); err != nil {
		return err
	}
	t := f.tables[r.Table]
	if t == nil {
		return nil
	}
	// iptables -D removes the first match only; EnsureRule never makes two.
	if i := slices.Index(t.rules[r.Chain], r.String()); i >= 0 {
		t.rules[r.Chain] = slices.Delete(t.rules[r.Chain], i, i+1)
	}
	return nil
}

// HasRule reports whether r is present; a missing chain is false.
func (f *Fake) HasRule(r Rule) (bool, error) {
	if err := r.Validate(); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("HasRule", r.Table, r.Chain); err != nil {
		return false, err
	}
	t := f.tables[r.Table]
	return t != nil && slices.Contains(t.rules[r.Chain], r.String()), nil
}

// ListRules returns the chain's "-A" lines.
func (f *Fake) ListRules(table, chain string) ([]string, error) {
	if err := validChain(table, chain); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("ListRules", table, chain); err != nil {
		return nil, err
	}
	if !f.chainExists(table, chain) {
		return nil, notFound("list rules", table, chain, "-S", chain)
	}
	var out []string
	if t := f.tables[table]; t != nil {
		out = slices.Clone(t.rules[chain])
	}
	return out, nil
}

// EnsureJump inserts `-A from -j to` at the top of from if absent.
func (f *Fake) EnsureJump(table, fromChain, toChain string) error {
	if err := validChain(table, fromChain); err != nil {
		return err
	}
	if err := validName("target chain", toChain); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.hook("EnsureJump", table, fromChain); err != nil {
		return err
	}
	for _, c := range []string{fromChain, toChain} {
		if !f.chainExists(table, c) {
			return notFound("ensure jump", table, c, "-I", fromChain, "1", "-j", toChain)
		}
	}
	t := f.table(table)
	line := "-A " + fromChain + " -j " + toChain
	if !slices.Contains(t.rules[fromChain], line) {
		t.rules[fromChain] = append([]string{line}, t.rules[fromChain]...)
	}
	return nil
}

// Dump prints the state like iptables-save, in the canonical form of
// CanonicalSave, so a test can compare the fake with a real node.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var tables []saveTable
	for n, t := range f.tables {
		st := saveTable{name: n, policy: map[string]string{}, rules: map[string][]string{}}
		st.chains = slices.Clone(t.chains)
		for c, rs := range t.rules {
			st.rules[c] = slices.Clone(rs)
		}
		tables = append(tables, st)
	}
	return formatSave(tables)
}
