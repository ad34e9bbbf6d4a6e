// Package dataplane is the node-side seam between the agent's operation state
// machine and the kernel/OVS drivers in pkg/.
//
// A Backend changes one node's overlay tunnel port exactly and reversibly.
// The agent persists the Snapshot a backend returns before any effect takes
// place, and hands it back after a restart, so every method must be
// idempotent and must work from the Snapshot alone (no in-memory state is
// required for correctness; a backend may cache pre-built messages for speed).
//
// This package must not know about gRPC, operations or clocks.
package dataplane

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// State is the tunnel state read back from the dataplane itself.
type State struct {
	Backend string            `json:"backend"`
	Device  string            `json:"device"`
	Port    tunnelport.Port   `json:"port"`
	Detail  map[string]string `json:"detail,omitempty"` // e.g. ofport, error, vni
	// Written and Effective are set by Commit: when the change left for
	// the dataplane (the OVSDB write sent; the kernel's old device first
	// touched) and when it took effect (ovs-vswitchd confirmed it; the
	// kernel's window closed). Zero when there was nothing to do (a
	// replay). The report's effect spread is taken from them, not from
	// the agents' wake-ups.
	Written   time.Time `json:"-"`
	Effective time.Time `json:"-"`
}

// Snapshot records the prior state of a change: enough to redo or undo it
// after a restart. Data is backend-specific (a kernel device dump, say).
type Snapshot struct {
	Backend  string          `json:"backend"`
	Device   string          `json:"device"`
	FromPort tunnelport.Port `json:"from_port"`
	ToPort   tunnelport.Port `json:"to_port"`
	Data     json.RawMessage `json:"data,omitempty"`
}

// Check is the outcome of a preflight on one node.
type Check struct {
	CurrentPort  tunnelport.Port
	TargetFree   bool
	TargetHolder string   // who holds the target port when it is not free
	Problems     []string // empty when this node can go ahead
	Actions      []string // what prepare and commit would do, in order
}

// Backend is one kind of overlay (OVS vxlan0, kernel VXLAN device).
type Backend interface {
	// Name is "ovs" or "kernel-vxlan".
	Name() string
	// Device names the tunnel device or interface the backend manages.
	Device() string
	// Read returns the effective state, read back from the dataplane.
	Read(ctx context.Context) (State, error)
	// Preflight checks a change to port to. It changes nothing.
	Preflight(ctx context.Context, to tunnelport.Port) (Check, error)
	// Snapshot records the prior state for a change from → to. It changes
	// nothing and fails if the current port is not from.
	Snapshot(ctx context.Context, from, to tunnelport.Port) (Snapshot, error)
	// Prepare opens the target port in the firewall and pre-builds the
	// change. Nothing flips.
	Prepare(ctx context.Context, s Snapshot) error
	// Commit applies the change and reads it back. It must be fast: all
	// validation happened in Prepare.
	Commit(ctx context.Context, s Snapshot) (State, error)
	// Revert puts the prior port back (a no-op when already there) and
	// removes the firewall opening Prepare added.
	Revert(ctx context.Context, s Snapshot) (State, error)
	// Abort undoes Prepare before any commit.
	Abort(ctx context.Context, s Snapshot) error
	// Finalize removes the old port's firewall rules after a confirmed change.
	Finalize(ctx context.Context, s Snapshot) error
	// Ready reports what is not ready, by name (empty: ready). Used by /readyz.
	Ready(ctx context.Context) []string
}

// AfterCommitter is a Backend with work a commit needs done that must not
// hold up the commit's answer: the coordinator judges the node by when
// that answer arrives, and the overlay gains nothing from waiting for it
// (the kernel backend's deletion of the old port's conntrack entries
// walks the kernel's whole conntrack table: 90-220 ms per node in an
// 8-node lab). The agent calls AfterCommit once a commit was
// answered, before any later command for the operation is served. Detail
// is what it measured, for the log; an error is logged, never a reason to
// undo the change.
type AfterCommitter interface {
	Backend
	AfterCommit(ctx context.Context, s Snapshot) (detail map[string]string, err error)
}

// CommitArmer is a Backend that can do a commit's reading ahead, while the
// agent waits for the commit instant (hundreds of milliseconds after the
// Commit call arrives), so that between the instant and the change only
// what must happen then is left: every millisecond spent there is a
// millisecond between this node's flip and its peers'. The agent calls
// ArmCommit before it sleeps until the instant; ctx bounds it well
// before the instant. Commit then uses what was armed if nothing it
// depends on changed since, and otherwise does all its work itself, as
// without arming; Abort and Revert drop it. An error only means Commit
// does all its work itself; it is logged.
type CommitArmer interface {
	Backend
	ArmCommit(ctx context.Context, s Snapshot) error
}

// Keeper is a Backend that keeps something of its own in place between
// operations: the OVS backend's standing redirect flows
// (--ovs-standing-redirects, docs/staged.md), installed once so that a
// staged operation changes no flow table. The agent calls Keep when the
// backend comes up and then every minute; Keep changes nothing when what
// it keeps is in place, and it repairs it otherwise (gone after an OVS
// restart, stale after the tunnel was recreated, or in the way of another
// interface).
type Keeper interface {
	Backend
	// Keep puts what the backend keeps in place. changed reports whether
	// it had to write anything.
	Keep(ctx context.Context) (changed bool, err error)
}

// PortKeeper is a Backend that keeps the overlay's current port, read
// back from the dataplane, open in the node firewall between operations
// (Firewall.KeepOpen): the agent calls it at start and then every minute,
// so a node that rebooted or joined after a cutover, behind a default-deny
// firewall, is not cut off. removeStale is passed only while no operation
// is in flight.
type PortKeeper interface {
	Backend
	KeepPortOpen(ctx context.Context, removeStale bool) (Kept, error)
}

// NodeCleaner is a Backend that can remove everything Cutover made on the
// node (uninstall: `cutover-agent cleanup`): the firewall rules it marked
// as its own, and its leftover devices, ports and flows; never the
// overlay's own device or interface, and never a rule without its mark.
// The caller makes sure no operation is in flight. It returns what it
// removed, in words.
type NodeCleaner interface {
	Backend
	CleanupNode(ctx context.Context) ([]string, error)
}

// StagedAdvisor is a Stager that says whether, on this node as
// configured, the staged strategy loses less than the atomic one (by the
// lab's figures at N = 32, docs/staged.md), and why. The coordinator's
// strategy "auto" runs staged only where every node says so.
type StagedAdvisor interface {
	Stager
	StagedLosesLess() (bool, string)
}

// Stager is a Backend that supports the staged (make-before-break)
// strategy: every node first receives on both ports, then the senders
// switch to the new port a batch at a time, then the old port is retired.
// Invariant: at every moment a node receives on every port any node sends
// on. So receiving on both is always safe, and sending is the only thing
// a node may undo by itself (the dead-man calls UnswitchSend, never
// Unlisten: a node cannot know whether a peer already sends the new
// port).
//
// Every method works from the Snapshot alone (taken before Listen, so it
// records the node state Listen changes, such as a sysctl) and is
// idempotent: a replay, or a call after a restart, converges on the
// state the method promises and does nothing when it is already there.
type Stager interface {
	Backend
	// StagedProblems names why this node cannot run the staged strategy
	// (an overlay whose controller would undo the second receiver, say);
	// empty when it can. Changes nothing.
	StagedProblems(ctx context.Context, to tunnelport.Port) []string
	// StagedActions is what Listen, SwitchSend and Retire would do here,
	// in order, for the plan. Changes nothing.
	StagedActions(from, to tunnelport.Port) []string
	// Listen opens s.ToPort in the firewall, then makes the node receive
	// on s.ToPort as well as s.FromPort. Sending is unchanged.
	Listen(ctx context.Context, s Snapshot) error
	// Unlisten undoes Listen (the second receiver and the firewall
	// opening go; what Listen changed is restored). Only safe once no
	// node sends s.ToPort. A no-op when not listening.
	Unlisten(ctx context.Context, s Snapshot) error
	// SwitchSend makes the node send on s.ToPort (it keeps receiving on
	// both) and reads the state back: State.Port is then the port the node
	// sends on (s.ToPort), whatever port the device itself still has.
	// Requires Listen.
	SwitchSend(ctx context.Context, s Snapshot) (State, error)
	// UnswitchSend puts the node's sending back on s.FromPort (State.Port
	// s.FromPort); it keeps receiving on both.
	UnswitchSend(ctx context.Context, s Snapshot) (State, error)
	// Retire ends the change once every node sends s.ToPort: the overlay
	// is left in its normal form on s.ToPort (the tunnel device or
	// interface itself on the new port, the second receiver and the extra
	// flows or entries gone) and the old port's firewall rules removed.
	// State.Port is then s.ToPort.
	Retire(ctx context.Context, s Snapshot) (State, error)
}
