package iptables

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Interface is everything the agent does to the firewall. The reconciler sees
// only this; Client is the real one and Fake the in-memory one.
//
// A chain made by EnsureChain is not reached by any packet until something
// jumps to it from INPUT (or raw PREROUTING). On a real OpenShift node the
// CNI's own rules already jump to OS_FIREWALL_ALLOW / OPENSHIFT-*; wiring a
// new chain in is the caller's business. EnsureJump exists for labs.
type Interface interface {
	// EnsureChain creates the chain if absent.
	EnsureChain(table, chain string) error
	// EnsureRule inserts r at the top of its chain if no identical rule is
	// in it, so that it takes effect before any catch-all REJECT or DROP
	// already there (RHEL's and firewalld's INPUT end in one). The chain
	// must exist (IsNotFound otherwise).
	EnsureRule(r Rule) error
	// DeleteRule deletes r; a rule (or chain) that is absent is not an error.
	DeleteRule(r Rule) error
	// HasRule reports whether r is in its chain; a missing chain is false.
	HasRule(r Rule) (bool, error)
	// ListRules returns the chain's rules as iptables-save "-A" lines, in
	// order. A missing chain gives IsNotFound.
	ListRules(table, chain string) ([]string, error)
	// EnsureJump inserts `-A fromChain -j toChain` at the top of fromChain if
	// absent.
	EnsureJump(table, fromChain, toChain string) error
	// Backend is "nft" or "legacy".
	Backend() string
}

// Config selects the backend.
type Config struct {
	// Backend is "auto" (or empty): detect; "nft" or "legacy": force.
	Backend string
	// LockWait bounds the wait for the xtables lock (iptables --wait), so a
	// stuck holder cannot hang the agent; 0 means 10s.
	LockWait time.Duration
	// Run is the exec seam for detection; nil runs the real commands.
	Run execseam.Func
}

// Client drives one backend's iptables binary through go-iptables. Commands
// run on the calling OS thread, so inside netns.Do they act on that netns.
type Client struct {
	backend   string
	path      string
	detection Detection
	ipt       *goipt.IPTables
}

var _ Interface = (*Client)(nil)

// New resolves the backend (detecting it for "auto") and binds go-iptables to
// that backend's binary, so the two are never mixed.
func New(ctx context.Context, cfg Config) (*Client, error) {
	b := cfg.Backend
	if b == "" {
		b = BackendAuto
	}
	if err := validBackend(b); err != nil {
		return nil, err
	}
	c := &Client{backend: b}
	if b == BackendAuto {
		d, err := Detect(ctx, cfg.Run)
		if err != nil {
			return nil, err
		}
		c.detection, c.backend = d, d.Backend
	} else {
		c.detection = Detection{Backend: b, Reason: "configured"}
	}
	path, err := exec.LookPath(Binary(c.backend))
	if err != nil {
		return nil, fmt.Errorf("iptables: backend %s: %w (install the iptables package, which ships both)", c.backend, err)
	}
	wait := cfg.LockWait
	if wait <= 0 {
		wait = defaultLockWait
	}
	ipt, err := goipt.New(goipt.Path(path), goipt.Timeout(int((wait+time.Second-1)/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("iptables: backend %s (%s): %w", c.backend, path, err)
	}
	c.path, c.ipt = path, ipt
	return c, nil
}

// Backend is "nft" or "legacy".
func (c *Client) Backend() string { return c.backend }

// Detection says how the backend was chosen.
func (c *Client) Detection() Detection { return c.detection }

func (c *Client) argv(table, op, chain string, spec ...string) []string {
	return append([]string{c.path, "-t", table, op, chain}, spec...)
}

func (c *Client) fail(op string, argv []string, err error) error {
	if IsNotFound(err) && !errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return &Error{Op: op, Argv: argv, Err: err}
}

// EnsureChain creates the chain if absent.
func (c *Client) EnsureChain(table, chain string) error {
	if err := validChain(table, chain); err != nil {
		return err
	}
	ok, err := c.ipt.ChainExists(table, chain)
	if err != nil {
		return c.fail("ensure chain", []string{c.path, "-t", table, "-S"}, err)
	}
	if ok {
		return nil
	}
	if err := c.ipt.NewChain(table, chain); err != nil {
		// Someone else may have created it between the check and -N.
		if ok, _ := c.ipt.ChainExists(table, chain); ok {
			return nil
		}
		return c.fail("ensure chain", c.argv(table, "-N", chain), err)
	}
	return nil
}

// EnsureRule inserts r at position 1 if absent: appended, an ACCEPT after
// a chain's catch-all REJECT would never be reached.
func (c *Client) EnsureRule(r Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	ok, err := c.HasRule(r)
	if err != nil || ok {
		return err
	}
	if err := c.ipt.Insert(r.Table, r.Chain, 1, r.Spec()...); err != nil {
		return c.fail("ensure rule", c.argv(r.Table, "-I", r.Chain, append([]string{"1"}, r.Spec()...)...), err)
	}
	return nil
}

// DeleteRule deletes r if present.
func (c *Client) DeleteRule(r Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	ok, err := c.HasRule(r)
	if err != nil || !ok {
		return err
	}
	if err := c.ipt.Delete(r.Table, r.Chain, r.Spec()...); err != nil {
		return c.fail("delete rule", c.argv(r.Table, "-D", r.Chain, r.Spec()...), err)
	}
	return nil
}

// HasRule runs iptables -C: a semantic match, so a rule added by hand with
// the same meaning counts as present.
func (c *Client) HasRule(r Rule) (bool, error) {
	if err := r.Validate(); err != nil {
		return false, err
	}
	ok, err := c.ipt.Exists(r.Table, r.Chain, r.Spec()...)
	if err != nil {
		return false, c.fail("check rule", c.argv(r.Table, "-C", r.Chain, r.Spec()...), err)
	}
	return ok, nil
}

// ListRules returns the chain's "-A" lines.
func (c *Client) ListRules(table, chain string) ([]string, error) {
	if err := validChain(table, chain); err != nil {
		return nil, err
	}
	lines, err := c.ipt.List(table, chain)
	if err != nil {
		// iptables-nft reports a missing chain as "incompatible, use 'nft'
		// tool", which no pattern recognises: ask directly.
		if ok, cerr := c.ipt.ChainExists(table, chain); cerr == nil && !ok {
			err = fmt.Errorf("%w: chain %s in table %s: %w", ErrNotFound, chain, table, err)
		}
		return nil, c.fail("list rules", c.argv(table, "-S", chain), err)
	}
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out, nil
}

// EnsureJump inserts the jump at position 1, so it precedes any catch-all
// REJECT/DROP already in fromChain (as OpenShift SDN inserts its own).
func (c *Client) EnsureJump(table, fromChain, toChain string) error {
	if err := validChain(table, fromChain); err != nil {
		return err
	}
	if err := validName("target chain", toChain); err != nil {
		return err
	}
	spec := []string{"-j", toChain}
	ok, err := c.ipt.Exists(table, fromChain, spec...)
	if err != nil {
		return c.fail("ensure jump", c.argv(table, "-C", fromChain, spec...), err)
	}
	if ok {
		return nil
	}
	if err := c.ipt.Insert(table, fromChain, 1, spec...); err != nil {
		return c.fail("ensure jump", c.argv(table, "-I", fromChain, append([]string{"1"}, spec...)...), err)
	}
	return nil
}
