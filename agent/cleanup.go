package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/agent/operation"
)

// CleanupReport is what Cleanup removed, in words.
type CleanupReport struct {
	Removed []string
}

// Cleanup removes everything Cutover made on this node (uninstall,
// `cutover-agent cleanup`): the firewall rules marked as the agent's
// own, the backend's leftover devices, receive ports and flows
// (dataplane.NodeCleaner), then the state directory. It refuses, changing
// nothing, while the durable record says an operation is in flight or
// FAILED: that record is what puts the node back, and removing it would
// strand a change. The overlay's own device, its port and rules without
// Cutover's mark stay. be nil builds the backend from cfg (NewBackend).
func Cleanup(ctx context.Context, cfg Config, be dataplane.Backend) (CleanupReport, error) {
	var rep CleanupReport
	store := operation.FileStore{Dir: cfg.StateDir}
	rec, err := store.Load()
	if err != nil {
		return rep, fmt.Errorf("cleanup refused: the operation record %s cannot be read (%w): it may describe a change still applied; fix or inspect it first", store.Path(), err)
	}
	if rec != nil && (rec.Phase.InFlight() || rec.Phase == operation.PhaseFailed) {
		return rep, fmt.Errorf("cleanup refused: operation %s is %s on this node (port %d -> %d, per %s): finish it or roll it back (coordctl rollback) first, then run cleanup again",
			rec.ID, rec.Phase, rec.FromPort, rec.ToPort, store.Path())
	}
	if be == nil {
		if be, err = NewBackend(cfg); err != nil {
			return rep, fmt.Errorf("cleanup: %w", err)
		}
	}
	if c, ok := be.(dataplane.NodeCleaner); ok {
		removed, err := c.CleanupNode(ctx)
		rep.Removed = append(rep.Removed, removed...)
		if err != nil {
			return rep, fmt.Errorf("cleanup: %w (the state directory %s is kept; run cleanup again)", err, cfg.StateDir)
		}
	}
	if _, err := os.Stat(cfg.StateDir); err == nil {
		if err := removeStateDir(cfg.StateDir); err != nil {
			return rep, fmt.Errorf("cleanup: remove the state directory: %w", err)
		}
		rep.Removed = append(rep.Removed, "state directory "+cfg.StateDir)
	}
	return rep, nil
}

// removeStateDir removes dir's contents, then dir itself unless it is a
// mount point (a hostPath on a disk of its own, or a bind mount: rmdir
// says EBUSY), which then stays, empty.
func removeStateDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, syscall.EBUSY) {
		return err
	}
	return nil
}
