package kernelvxlan

import (
	"context"
	"fmt"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// Reading ahead of the commit instant (dataplane.CommitArmer): the fresh
// read a Commit needs is done while the agent waits for the instant,
// under a netlink watch; at the instant the watch says whether it still
// holds (docs/kernel-vxlan.md, "Reading ahead of the instant").

// armedCommit is a commit's reading done ahead (ArmCommit).
type armedCommit struct {
	key string // armKey of the snapshot it was armed for
	a   *vxlan.Armed
	dur time.Duration // how long arming took
}

// armKey names the operation a snapshot is for.
func armKey(s dataplane.Snapshot) string {
	return fmt.Sprintf("%s|%d|%d|%s", s.Device, s.FromPort, s.ToPort, s.Data)
}

// ArmCommit implements dataplane.CommitArmer: the fresh read Commit would
// do at the instant (the device and everything bound to it) and the
// top-up of the prebuilt device to it, done now, with a watch on the
// device from before the read (vxlan.Armed). A device that is not as
// Commit would recreate it (another port, changed configuration) is not
// armed: Commit's own read says what is wrong.
func (b *Backend) ArmCommit(ctx context.Context, s dataplane.Snapshot) error {
	b.disarm()
	sd, err := b.decode(s)
	if err != nil {
		return err
	}
	t0 := time.Now()
	a, err := b.cfg.VXLAN.Arm(ctx, b.cfg.Device, int(s.ToPort))
	if err != nil {
		return fmt.Errorf("read %s ahead of the commit instant: %w", b.cfg.Device, err)
	}
	if a.Snap.Device.Port != int(s.FromPort) || deviceDiff(sd.Device.Device, a.Snap.Device) != "" {
		a.Close()
		return nil
	}
	b.mu.Lock()
	b.armed = &armedCommit{key: armKey(s), a: a, dur: time.Since(t0)}
	b.mu.Unlock()
	return nil
}

// takeArmed returns what ArmCommit read for s (nil: nothing) and forgets
// it: it is good for one Commit.
func (b *Backend) takeArmed(s dataplane.Snapshot) *armedCommit {
	b.mu.Lock()
	ac := b.armed
	b.armed = nil
	b.mu.Unlock()
	if ac != nil && ac.key != armKey(s) {
		ac.a.Close()
		return nil
	}
	return ac
}

// disarm drops what ArmCommit read, if anything.
func (b *Backend) disarm() {
	if ac := b.takeArmed(dataplane.Snapshot{}); ac != nil {
		ac.a.Close()
	}
}

// moveArmed is move("commit") from what ArmCommit read, which already
// passed move's checks (on from, configuration as in the snapshot). ok
// false: the device may have changed since that read, nothing was
// touched, and move must read afresh; why says what was seen.
func (b *Backend) moveArmed(ac *armedCommit, to tunnelport.Port) (o outcome, ok bool, why string, err error) {
	w, err := b.cfg.VXLAN.RecreateArmed(ac.a)
	if vxlan.IsChanged(err) {
		return outcome{}, false, err.Error(), nil
	}
	if err != nil {
		return outcome{w: w}, true, "", fmt.Errorf("commit %s ->%d: %w", b.cfg.Device, to, err)
	}
	o, err = b.readBack("commit", w, to)
	return o, true, "", err
}
