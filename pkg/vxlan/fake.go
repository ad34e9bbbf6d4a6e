package vxlan

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Fake is an in-memory Interface for unit tests of the agent's logic. It
// follows the kernel's rules that matter to callers: missing and non-VXLAN
// devices give the typed errors, a recreation keeps everything but the port,
// and FDB ports equal to the device's port read back as 0.
type Fake struct {
	mu      sync.Mutex
	devices map[string]Snapshot
	// Others are non-VXLAN links, name → type, for IsNotVXLAN.
	Others map[string]string
	// Recreations counts successful Recreate calls.
	Recreations int
	// Cleanups counts Cleanup calls.
	Cleanups int
	// Prebuilt maps a device name to the port of the device Prebuild made
	// for it and no Recreate adopted or Cleanup removed yet.
	Prebuilt map[string]int
	// FailNext, when set, is returned (wrapped) by the next mutating call.
	FailNext error
	// Listening maps a device name to the port of the receiver Listen
	// raised for it (up, also in Prebuilt) until a Recreate adopts it or
	// Cleanup removes it.
	Listening map[string]int
	// RPFilter is each device's rp_filter (absent: 0); RPFilterAll is
	// conf.all's.
	RPFilter    map[string]int
	RPFilterAll int
	// changes counts the calls that changed a device, so that
	// RecreateArmed can tell whether Arm's read is still current.
	changes uint64
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake holding the given devices.
func NewFake(devs ...Snapshot) *Fake {
	f := &Fake{devices: map[string]Snapshot{}, Others: map[string]string{}, Prebuilt: map[string]int{}, Listening: map[string]int{}, RPFilter: map[string]int{}}
	for _, d := range devs {
		f.devices[d.Device.Name] = clone(d)
	}
	return f
}

func clone(s Snapshot) Snapshot {
	s.Addrs = append([]Addr(nil), s.Addrs...)
	s.FDB = append([]FDBEntry(nil), s.FDB...)
	s.Neighbors = append([]Neighbor(nil), s.Neighbors...)
	s.Routes = append([]Route(nil), s.Routes...)
	return s
}

func (f *Fake) get(op, name string) (Snapshot, error) {
	if s, ok := f.devices[name]; ok {
		return s, nil
	}
	if t, ok := f.Others[name]; ok {
		return Snapshot{}, &Error{Op: op, Device: name, Err: fmt.Errorf("%w: link type is %q", ErrNotVXLAN, t)}
	}
	return Snapshot{}, &Error{Op: op, Device: name, Err: ErrNotFound}
}

func (f *Fake) failNext(op, name string) error {
	if f.FailNext == nil {
		return nil
	}
	err := f.FailNext
	f.FailNext = nil
	return &Error{Op: op, Device: name, Err: err}
}

// Snapshot implements Interface.
func (f *Fake) Snapshot(name string) (Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.get("snapshot", name)
	return clone(s), err
}

// Recreate implements Interface. Like the kernel driver it also rebuilds a
// device that is gone.
func (f *Fake) Recreate(snap Snapshot, newPort int) (Window, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recreateLocked(snap, newPort)
}

func (f *Fake) recreateLocked(snap Snapshot, newPort int) (Window, error) {
	name := snap.Device.Name
	if err := snap.Validate(); err != nil {
		return Window{}, err
	}
	if err := validPort("newPort", newPort); err != nil {
		return Window{}, &Error{Op: "recreate", Device: name, Err: err}
	}
	if t, ok := f.Others[name]; ok {
		return Window{}, &Error{Op: "recreate", Device: name, Err: fmt.Errorf("%w: link type is %q", ErrNotVXLAN, t)}
	}
	if err := f.failNext("recreate", name); err != nil {
		return Window{}, err
	}
	now := time.Now()
	w := Window{Strategy: "fake", Start: now, End: now}
	if p, ok := f.Prebuilt[name]; ok {
		w.Adopted = p == newPort
		delete(f.Prebuilt, name)
		if f.Listening[name] == p && w.Adopted {
			// The adopted receiver becomes the device, rp_filter and all.
			f.RPFilter[name] = 0
		}
		delete(f.Listening, name)
	}
	n := clone(snap)
	n.Device.Port = newPort
	for i := range n.FDB {
		if n.FDB[i].Port == newPort {
			n.FDB[i].Port = 0
		}
	}
	f.devices[name] = n
	f.changes++
	f.Recreations++
	return w, nil
}

// Prebuild implements Interface: it records the prebuilt device's port.
func (f *Fake) Prebuild(snap Snapshot, newPort int) (Window, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := snap.Device.Name
	if err := snap.Validate(); err != nil {
		return Window{}, err
	}
	if err := validPort("newPort", newPort); err != nil {
		return Window{}, &Error{Op: "prebuild", Device: name, Err: err}
	}
	if err := f.failNext("prebuild", name); err != nil {
		return Window{}, err
	}
	f.Prebuilt[name] = newPort
	f.changes++
	return Window{Strategy: "fake"}, nil
}

// Cleanup implements Interface. The fake deletes its old device at once;
// a prebuilt one goes; calls are counted.
func (f *Fake) Cleanup(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Cleanups++
	f.changes++
	delete(f.Prebuilt, name)
	delete(f.Listening, name)
	return nil
}

// Listen implements Interface: it records the receiver's port.
func (f *Fake) Listen(snap Snapshot, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := snap.Device.Name
	if err := snap.Validate(); err != nil {
		return err
	}
	if err := validPort("port", port); err != nil {
		return &Error{Op: "listen", Device: name, Err: err}
	}
	if err := f.failNext("listen", name); err != nil {
		return err
	}
	f.Prebuilt[name], f.Listening[name] = port, port
	f.changes++
	return nil
}

// ReversePathFilter implements Interface.
func (f *Fake) ReversePathFilter(name string) (dev, all int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.get("rp-filter", name); err != nil {
		return 0, 0, err
	}
	return f.RPFilter[name], f.RPFilterAll, nil
}

// SetReversePathFilter implements Interface.
func (f *Fake) SetReversePathFilter(name string, value int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.get("rp-filter", name); err != nil {
		return err
	}
	if err := f.failNext("rp-filter", name); err != nil {
		return err
	}
	f.RPFilter[name] = value
	f.changes++
	return nil
}

// SetFDBPorts implements Interface.
func (f *Fake) SetFDBPorts(snap Snapshot, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := snap.Device.Name
	if port != 0 {
		if err := validPort("port", port); err != nil {
			return &Error{Op: "set-fdb-ports", Device: name, Err: err}
		}
	}
	s, err := f.get("set-fdb-ports", name)
	if err != nil {
		return err
	}
	if err := f.failNext("set-fdb-ports", name); err != nil {
		return err
	}
	if port == s.Device.Port {
		port = 0
	}
	for i := range s.FDB {
		s.FDB[i].Port = port
	}
	f.devices[name] = s
	f.changes++
	return nil
}

// Delete removes a device, as a crash inside the window would leave it.
func (f *Fake) Delete(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.devices, name)
	f.changes++
}

// Arm implements Interface: the read and the change counter at it.
func (f *Fake) Arm(ctx context.Context, name string, newPort int) (*Armed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := validPort("newPort", newPort); err != nil {
		return nil, &Error{Op: "arm", Device: name, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "arm", Device: name, Err: err}
	}
	s, err := f.get("arm", name)
	if err != nil {
		return nil, err
	}
	return &Armed{Snap: clone(s), port: newPort, gen: f.changes}, nil
}

// RecreateArmed implements Interface: ErrChanged when any device changed
// since Arm.
func (f *Fake) RecreateArmed(a *Armed) (Window, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changes != a.gen {
		return Window{}, &Error{Op: "recreate", Device: a.Snap.Device.Name, Err: fmt.Errorf("%w: %d change(s) since", ErrChanged, f.changes-a.gen)}
	}
	return f.recreateLocked(a.Snap, a.port)
}

// Link implements Interface.
func (f *Fake) Link(name string) (Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.get("link", name)
	return s.Device, err
}

// Dump returns every device's Snapshot.Text, sorted by name.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.devices))
	for n := range f.devices {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(f.devices[n].Text())
	}
	return b.String()
}
