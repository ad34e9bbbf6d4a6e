// Package nsiptables is test support: an iptables.Interface that runs every
// call of a real pkg/iptables Client on a thread inside one network
// namespace. The Client execs the iptables binaries, which inherit the
// calling thread's namespace, so privileged tests drive a fresh namespace's
// firewall through the very code the agent ships.
//
// Only tests may import it (the harness is linked by no shipped binary).
package nsiptables

import (
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// IPT is C, called inside namespace NS.
type IPT struct {
	NS string
	C  *iptables.Client
}

var _ iptables.Interface = IPT{}

func (n IPT) do(fn func() error) error { return netns.Do(n.NS, fn) }

// EnsureChain implements iptables.Interface.
func (n IPT) EnsureChain(table, chain string) error {
	return n.do(func() error { return n.C.EnsureChain(table, chain) })
}

// EnsureRule implements iptables.Interface.
func (n IPT) EnsureRule(r iptables.Rule) error {
	return n.do(func() error { return n.C.EnsureRule(r) })
}

// DeleteRule implements iptables.Interface.
func (n IPT) DeleteRule(r iptables.Rule) error {
	return n.do(func() error { return n.C.DeleteRule(r) })
}

// HasRule implements iptables.Interface.
func (n IPT) HasRule(r iptables.Rule) (ok bool, err error) {
	err = n.do(func() error { ok, err = n.C.HasRule(r); return err })
	return ok, err
}

// ListRules implements iptables.Interface.
func (n IPT) ListRules(table, chain string) (out []string, err error) {
	err = n.do(func() error { out, err = n.C.ListRules(table, chain); return err })
	return out, err
}

// EnsureJump implements iptables.Interface.
func (n IPT) EnsureJump(table, from, to string) error {
	return n.do(func() error { return n.C.EnsureJump(table, from, to) })
}

// Backend implements iptables.Interface.
func (n IPT) Backend() string { return n.C.Backend() }
