package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Method names accepted by Fake.SetFailure, Fake.FailNext and
// Fake.SetLatency: the Backend method names.
const (
	MethodRead      = "Read"
	MethodPreflight = "Preflight"
	MethodSnapshot  = "Snapshot"
	MethodPrepare   = "Prepare"
	MethodCommit    = "Commit"
	MethodRevert    = "Revert"
	MethodAbort     = "Abort"
	MethodFinalize  = "Finalize"
	// The Stager methods.
	MethodListen       = "Listen"
	MethodUnlisten     = "Unlisten"
	MethodSwitchSend   = "SwitchSend"
	MethodUnswitchSend = "UnswitchSend"
	MethodRetire       = "Retire"
)

var fakeMethods = []string{MethodRead, MethodPreflight, MethodSnapshot, MethodPrepare,
	MethodCommit, MethodRevert, MethodAbort, MethodFinalize,
	MethodListen, MethodUnlisten, MethodSwitchSend, MethodUnswitchSend, MethodRetire}

// Fake is an in-memory Backend for tests and benchmarks of everything above
// the drivers. It models one tunnel port and a set of firewall openings, and
// Dump prints them canonically (`port=4789 fw=[4789 4889]`) so tests compare
// text. Every method is idempotent and works from the Snapshot alone, as the
// Backend contract requires; failures and latency can be injected per method.
// It is safe for concurrent use.
type Fake struct {
	mu       sync.Mutex
	name     string
	device   string
	port     tunnelport.Port
	fw       map[tunnelport.Port]bool
	holders  map[tunnelport.Port]string // ports held by some other socket (Preflight)
	notReady []string
	fail     map[string]error // persistent failures
	failNext map[string]error // one-shot failures
	latency  map[string]time.Duration
	calls    []string
	// The staged strategy: a second receiver's port (0: none) and the port
	// the node sends on when it is not the tunnel's own (0: the tunnel's).
	rx2  tunnelport.Port
	send tunnelport.Port
	// stagedRefusal, when set, is StagedProblems' answer.
	stagedRefusal string
}

var _ Stager = (*Fake)(nil)

// fakeData is the backend-specific part of a Fake snapshot: whether the
// target port was already open before Prepare, so that Abort and Revert do
// not close an opening they did not make.
type fakeData struct {
	ToWasOpen bool `json:"to_was_open"`
}

// NewFake returns a fake backend called name (e.g. "ovs") managing device,
// with the tunnel on port and the firewall open for port only.
func NewFake(name, device string, port tunnelport.Port) *Fake {
	return &Fake{
		name:     name,
		device:   device,
		port:     port,
		fw:       map[tunnelport.Port]bool{port: true},
		holders:  map[tunnelport.Port]string{},
		fail:     map[string]error{},
		failNext: map[string]error{},
		latency:  map[string]time.Duration{},
	}
}

// SetFailure makes every later call of method fail with err (nil clears
// it). The failure happens before any effect.
func (f *Fake) SetFailure(method string, err error) {
	mustMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, method)
		return
	}
	f.fail[method] = err
}

// FailNext makes only the next call of method fail with err.
func (f *Fake) FailNext(method string, err error) {
	mustMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[method] = err
}

// SetLatency makes every call of method take at least d (honouring the
// context); method "" sets it for all methods.
func (f *Fake) SetLatency(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if method == "" {
		for _, m := range fakeMethods {
			f.latency[m] = d
		}
		return
	}
	mustMethod(method)
	f.latency[method] = d
}

// SetNotReady sets what Ready reports.
func (f *Fake) SetNotReady(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notReady = slices.Clone(names)
}

// SetPort changes the tunnel port behind the agent's back, as an operator
// or the CNI would.
func (f *Fake) SetPort(p tunnelport.Port) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.port = p
}

// SetFirewall replaces the set of firewall openings (to set up a state a
// test resumes from).
func (f *Fake) SetFirewall(ports ...tunnelport.Port) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fw = map[tunnelport.Port]bool{}
	for _, p := range ports {
		f.fw[p] = true
	}
}

// SetHolder marks port as bound by holder (empty: free), for Preflight.
func (f *Fake) SetHolder(port tunnelport.Port, holder string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if holder == "" {
		delete(f.holders, port)
		return
	}
	f.holders[port] = holder
}

// Port returns the tunnel port.
func (f *Fake) Port() tunnelport.Port {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.port
}

// Dump prints the state canonically: `port=4789 fw=[4789 4889]`.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	open := make([]int, 0, len(f.fw))
	for p := range f.fw {
		open = append(open, int(p))
	}
	slices.Sort(open)
	s := make([]string, len(open))
	for i, p := range open {
		s[i] = strconv.Itoa(p)
	}
	out := fmt.Sprintf("port=%d fw=[%s]", f.port, strings.Join(s, " "))
	if f.rx2 != 0 || f.send != 0 {
		out += fmt.Sprintf(" rx2=%d send=%d", f.rx2, f.sendPort())
	}
	return out
}

// Calls returns the effectful calls made so far (Prepare, Commit, Revert,
// Abort, Finalize), each as "Method from->to", in order.
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Name implements Backend.
func (f *Fake) Name() string { return f.name }

// Device implements Backend.
func (f *Fake) Device() string { return f.device }

// enter applies the injected latency and failure of method. It must be
// called without f.mu held.
func (f *Fake) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	d := f.latency[method]
	err := f.failNext[method]
	delete(f.failNext, method)
	if err == nil {
		err = f.fail[method]
	}
	f.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fake %s: %w", method, ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake %s: %w", method, err)
	}
	if err != nil {
		return fmt.Errorf("fake %s: %w", method, err)
	}
	return nil
}

func (f *Fake) state() State {
	return State{Backend: f.name, Device: f.device, Port: f.port}
}

func (f *Fake) record(method string, s Snapshot) {
	f.calls = append(f.calls, fmt.Sprintf("%s %d->%d", method, s.FromPort, s.ToPort))
}

func (f *Fake) check(s Snapshot) (fakeData, error) {
	var d fakeData
	if s.Backend != f.name || s.Device != f.device {
		return d, fmt.Errorf("fake: snapshot is for %s/%s, this backend is %s/%s", s.Backend, s.Device, f.name, f.device)
	}
	if len(s.Data) > 0 {
		if err := json.Unmarshal(s.Data, &d); err != nil {
			return d, fmt.Errorf("fake: snapshot data: %w", err)
		}
	}
	return d, nil
}

// Read implements Backend.
func (f *Fake) Read(ctx context.Context) (State, error) {
	if err := f.enter(ctx, MethodRead); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state(), nil
}

// Preflight implements Backend.
func (f *Fake) Preflight(ctx context.Context, to tunnelport.Port) (Check, error) {
	if err := f.enter(ctx, MethodPreflight); err != nil {
		return Check{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := Check{CurrentPort: f.port, TargetFree: true}
	if h, ok := f.holders[to]; ok {
		c.TargetFree = false
		c.TargetHolder = h
		c.Problems = append(c.Problems, fmt.Sprintf("target port %d is bound by %s", to, h))
	}
	if to == f.port {
		c.Problems = append(c.Problems, fmt.Sprintf("target port %d is already the current port", to))
	}
	c.Problems = append(c.Problems, f.notReady...)
	c.Actions = []string{
		fmt.Sprintf("open udp/%d in the firewall", to),
		fmt.Sprintf("set %s port %d -> %d", f.device, f.port, to),
	}
	return c, nil
}

// Snapshot implements Backend.
func (f *Fake) Snapshot(ctx context.Context, from, to tunnelport.Port) (Snapshot, error) {
	if err := f.enter(ctx, MethodSnapshot); err != nil {
		return Snapshot{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.port != from {
		return Snapshot{}, fmt.Errorf("fake: current port of %s is %d, not from_port %d", f.device, f.port, from)
	}
	data, err := json.Marshal(fakeData{ToWasOpen: f.fw[to]})
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Backend: f.name, Device: f.device, FromPort: from, ToPort: to, Data: data}, nil
}

// Prepare implements Backend.
func (f *Fake) Prepare(ctx context.Context, s Snapshot) error {
	if err := f.enter(ctx, MethodPrepare); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return err
	}
	f.record(MethodPrepare, s)
	f.fw[s.ToPort] = true
	return nil
}

// Commit implements Backend.
func (f *Fake) Commit(ctx context.Context, s Snapshot) (State, error) {
	if err := f.enter(ctx, MethodCommit); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return State{}, err
	}
	f.record(MethodCommit, s)
	f.port = s.ToPort
	return f.state(), nil
}

// Revert implements Backend.
func (f *Fake) Revert(ctx context.Context, s Snapshot) (State, error) {
	if err := f.enter(ctx, MethodRevert); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.check(s)
	if err != nil {
		return State{}, err
	}
	f.record(MethodRevert, s)
	f.port = s.FromPort
	f.fw[s.FromPort] = true // Finalize may have closed it: the prior state had it open
	if !d.ToWasOpen && s.ToPort != s.FromPort {
		delete(f.fw, s.ToPort)
	}
	return f.state(), nil
}

// Abort implements Backend.
func (f *Fake) Abort(ctx context.Context, s Snapshot) error {
	if err := f.enter(ctx, MethodAbort); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.check(s)
	if err != nil {
		return err
	}
	f.record(MethodAbort, s)
	if !d.ToWasOpen && s.ToPort != s.FromPort {
		delete(f.fw, s.ToPort)
	}
	return nil
}

// Finalize implements Backend.
func (f *Fake) Finalize(ctx context.Context, s Snapshot) error {
	if err := f.enter(ctx, MethodFinalize); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return err
	}
	f.record(MethodFinalize, s)
	if s.FromPort != s.ToPort {
		delete(f.fw, s.FromPort)
	}
	return nil
}

// Ready implements Backend.
func (f *Fake) Ready(context.Context) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.notReady)
}

func mustMethod(m string) {
	if !slices.Contains(fakeMethods, m) {
		panic(fmt.Sprintf("dataplane.Fake: unknown method %q (want one of %v)", m, fakeMethods))
	}
}
