package dataplane

import (
	"context"
	"fmt"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// The Fake's staged strategy models what the invariant is about: the ports
// a node receives on (its tunnel's, plus a second receiver's) and the port
// it sends on. Listen refuses without the firewall opening first, and
// SwitchSend refuses without the second receiver, so a caller that gets the
// order wrong fails here as it would fail the overlay.

// SetStagedRefusal makes StagedProblems name why (empty clears it).
func (f *Fake) SetStagedRefusal(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stagedRefusal = why
}

// Reboot models the node rebooting in the middle of a staged change: the
// second receiver, the per-entry send ports and the firewall's opening of
// other ports are gone (kernel state, OpenFlow flows); the tunnel comes
// back on its own port (the CNI rebuilds it).
func (f *Fake) Reboot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rx2, f.send = 0, 0
	f.fw = map[tunnelport.Port]bool{f.port: true}
}

// Receives reports the ports the node receives on.
func (f *Fake) Receives() []tunnelport.Port {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rx2 != 0 && f.rx2 != f.port {
		return []tunnelport.Port{f.port, f.rx2}
	}
	return []tunnelport.Port{f.port}
}

// Sends reports the port the node sends on.
func (f *Fake) Sends() tunnelport.Port {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sendPort()
}

func (f *Fake) sendPort() tunnelport.Port {
	if f.send != 0 {
		return f.send
	}
	return f.port
}

// StagedProblems implements Stager.
func (f *Fake) StagedProblems(context.Context, tunnelport.Port) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stagedRefusal != "" {
		return []string{f.stagedRefusal}
	}
	return nil
}

// StagedActions implements Stager.
func (f *Fake) StagedActions(from, to tunnelport.Port) []string {
	return []string{
		fmt.Sprintf("open udp/%d in the firewall; receive on %d beside %d", to, to, from),
		fmt.Sprintf("send on %d", to),
		fmt.Sprintf("retire %d: %s on port %d, udp/%d closed", from, f.device, to, from),
	}
}

// Listen implements Stager.
func (f *Fake) Listen(ctx context.Context, s Snapshot) error {
	if err := f.enter(ctx, MethodListen); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return err
	}
	f.record(MethodListen, s)
	f.fw[s.ToPort] = true
	if f.port == s.FromPort {
		f.rx2 = s.ToPort
	}
	return nil
}

// Unlisten implements Stager.
func (f *Fake) Unlisten(ctx context.Context, s Snapshot) error {
	if err := f.enter(ctx, MethodUnlisten); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.check(s)
	if err != nil {
		return err
	}
	if f.send == s.ToPort {
		return fmt.Errorf("fake: unlisten %d while this node still sends it", s.ToPort)
	}
	f.record(MethodUnlisten, s)
	f.rx2 = 0
	if !d.ToWasOpen && s.ToPort != s.FromPort && f.port != s.ToPort {
		delete(f.fw, s.ToPort)
	}
	return nil
}

// SwitchSend implements Stager.
func (f *Fake) SwitchSend(ctx context.Context, s Snapshot) (State, error) {
	if err := f.enter(ctx, MethodSwitchSend); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return State{}, err
	}
	if f.port != s.ToPort && f.rx2 != s.ToPort {
		return State{}, fmt.Errorf("fake: switch sending to %d without receiving on it (Listen first)", s.ToPort)
	}
	f.record(MethodSwitchSend, s)
	if f.port != s.ToPort {
		f.send = s.ToPort
	}
	st := f.state()
	st.Port = f.sendPort()
	return st, nil
}

// UnswitchSend implements Stager.
func (f *Fake) UnswitchSend(ctx context.Context, s Snapshot) (State, error) {
	if err := f.enter(ctx, MethodUnswitchSend); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return State{}, err
	}
	if f.port != s.FromPort {
		return State{}, fmt.Errorf("fake: switch sending back to %d: port %d already retired", s.FromPort, s.FromPort)
	}
	f.record(MethodUnswitchSend, s)
	f.send = 0
	st := f.state()
	st.Port = f.sendPort()
	return st, nil
}

// Retire implements Stager.
func (f *Fake) Retire(ctx context.Context, s Snapshot) (State, error) {
	if err := f.enter(ctx, MethodRetire); err != nil {
		return State{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.check(s); err != nil {
		return State{}, err
	}
	if f.port == s.FromPort && f.sendPort() != s.ToPort {
		return State{}, fmt.Errorf("fake: retire %d while this node still sends it", s.FromPort)
	}
	f.record(MethodRetire, s)
	f.port, f.send, f.rx2 = s.ToPort, 0, 0
	if s.FromPort != s.ToPort {
		delete(f.fw, s.FromPort)
	}
	return f.state(), nil
}
