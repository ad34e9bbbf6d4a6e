package model

import (
	"context"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// OpInfo describes an operation to a Hook.
type OpInfo struct {
	ID       string
	Kind     string // "cutover", or "rollback" for a reverse cutover
	FromPort tunnelport.Port
	ToPort   tunnelport.Port
	Nodes    []string
}

// Hook lets a cluster integration act around an operation: keep a CNI's
// source of truth (flannel's ConfigMap, Calico's FelixConfiguration,
// OpenShift's ClusterNetwork) in step with the dataplane, or keep a CNI's
// own reconciler from fighting the change. Hooks run in the coordinator, on
// the control path; they never touch a node's dataplane.
//
// The runtime calls them in this order, each at most once per operation
// run, and journals that it did:
//
//	Preflight     with plan, dry run and cutover: problems refuse the cutover
//	BeforeCommit  after every agent is prepared, before the commit instant is
//	              chosen; an error aborts (nothing has flipped)
//	AfterConfirm  once every agent confirmed; an error is reported, the
//	              change stays (the dataplane is already verified good)
//	Finalize      after every agent finalized; an error is reported
//	Restore       when an operation whose BeforeCommit ran ends aborted or
//	              rolled back: put back what BeforeCommit changed
//
// A reverse cutover (rollback of a succeeded operation) is an operation of
// its own with FromPort and ToPort swapped, so its BeforeCommit/Finalize
// move the source of truth back.
type Hook interface {
	Name() string
	Preflight(ctx context.Context, op OpInfo) []string
	BeforeCommit(ctx context.Context, op OpInfo) error
	AfterConfirm(ctx context.Context, op OpInfo) error
	Finalize(ctx context.Context, op OpInfo) error
	Restore(ctx context.Context, op OpInfo) error
}

// Planner is a Hook that can say what it will do. When a hook implements
// it, plan, dry run and cutover call Plan instead of Preflight (one read
// of the cluster, not two): its problems refuse the cutover as
// Preflight's do, and its steps reach the admin in the plan
// (PlanResponse.hook_steps), where a line in the coordinator's log would
// reach nobody who runs kubectl cutover.
type Planner interface {
	Plan(ctx context.Context, op OpInfo) (steps, problems []string)
}

// NextStepper is a Hook that leaves the admin work once an operation
// succeeded: what only a person (or another controller's owner) can do,
// such as restarting a CNI daemon that keeps the old port in memory, or
// editing a master's configuration file. The lines go into the report
// (Report.next_steps), which coordctl and kubectl cutover print.
type NextStepper interface {
	NextSteps(op OpInfo) []string
}

// NopHook is a Hook that does nothing; embed it to implement only some
// methods.
type NopHook struct{}

// Name implements Hook.
func (NopHook) Name() string { return "nop" }

// Preflight implements Hook.
func (NopHook) Preflight(context.Context, OpInfo) []string { return nil }

// BeforeCommit implements Hook.
func (NopHook) BeforeCommit(context.Context, OpInfo) error { return nil }

// AfterConfirm implements Hook.
func (NopHook) AfterConfirm(context.Context, OpInfo) error { return nil }

// Finalize implements Hook.
func (NopHook) Finalize(context.Context, OpInfo) error { return nil }

// Restore implements Hook.
func (NopHook) Restore(context.Context, OpInfo) error { return nil }

// HookMark is one hook call of an operation. It is journaled before the
// call (started) and after it (done or failed), so a coordinator restarted
// in between knows the call may have acted.
type HookMark struct {
	Hook  string `json:"hook"`  // Hook.Name()
	Point string `json:"point"` // HookBeforeCommit, ...
	State string `json:"state"` // HookStarted, HookDone or HookFailed
	Error string `json:"error,omitempty"`
}
