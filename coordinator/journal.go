package coordinator

import (
	"fmt"
	"slices"

	"github.com/cutover-dev/cutover/coordinator/internal/opstate"
	"github.com/cutover-dev/cutover/coordinator/internal/statedir"
)

// describeJournal names where the journal is, for errors.
func describeJournal(j JournalStore, cfg Config) string {
	if s, ok := j.(fmt.Stringer); ok {
		return s.String()
	}
	if _, ok := j.(*statedir.Journal); ok {
		return "--state-dir " + cfg.StateDir
	}
	return fmt.Sprintf("journal %T", j)
}

// save journals the operation's control fields now (step, commit_sent,
// hooks: what a restarted coordinator decides from) and its report soon:
// the record is written at once with the report last encoded, and the
// report is encoded again in the background, the newest state taken when
// the encoder is free (requests while it is busy coalesce). The report is
// the change record, not the protocol's state; encoding it took 35-75 ms
// at 1,000 nodes and 0.3-0.7 s at 10,000 per save, with op.Mu held, at
// every step boundary. After a crash the journaled report is
// at most one background encoding old. Failures are logged and reported
// as events (the operation itself goes on: stopping half way would be
// worse); the error returned is the synchronous write's.
func (c *Coordinator) save(op *opstate.Op) error {
	err := c.writeRecord(op)
	op.SaveMu.Lock()
	if !op.EncodeQueued {
		op.EncodeQueued = true
		op.Encoders.Add(1)
		c.wg.Add(1) // Close waits for it: the state dir's lock outlives no write
		go func() {
			defer c.wg.Done()
			defer op.Encoders.Done()
			_ = c.encodeAndWrite(op)
		}()
	}
	op.SaveMu.Unlock()
	return err
}

// journalWriter is the journal as the runner writes it (runner.Journal).
type journalWriter struct{ c *Coordinator }

func (j journalWriter) Save(op *opstate.Op) error      { return j.c.save(op) }
func (j journalWriter) SaveFinal(op *opstate.Op) error { return j.c.saveFinal(op) }

// saveFinal journals the record and its report together, synchronously,
// after any background encoding: the record an ended run leaves.
func (c *Coordinator) saveFinal(op *opstate.Op) error {
	op.Encoders.Wait()
	return c.encodeAndWrite(op)
}

// encodeAndWrite encodes the report as it is now, outside op.Mu, then
// writes the record. Encodings are serialised (encodeMu), so the report
// bytes a record carries only ever get newer.
func (c *Coordinator) encodeAndWrite(op *opstate.Op) error {
	op.EncodeMu.Lock()
	defer op.EncodeMu.Unlock()
	op.SaveMu.Lock()
	op.EncodeQueued = false // a save from here on needs an encoding after this one
	op.SaveMu.Unlock()
	op.Mu.Lock()
	rep := op.SnapshotLocked()
	op.Mu.Unlock()
	b, err := opstate.JournaledReport(rep)
	if err != nil {
		c.journalFailed(op, err)
		return err
	}
	op.Mu.Lock()
	op.Rec.Report = b
	op.Mu.Unlock()
	return c.writeRecord(op)
}

// writeRecord writes op's record as it is at the write (the freshest
// control fields and report bytes: writes are serialised, so a later
// write never carries older state).
func (c *Coordinator) writeRecord(op *opstate.Op) error {
	op.WriteMu.Lock()
	defer op.WriteMu.Unlock()
	op.Mu.Lock()
	rec := op.Rec
	rec.Hooks = slices.Clone(rec.Hooks) // setHookMark changes marks in place
	op.Mu.Unlock()
	err := c.journal.Save(rec)
	if err != nil {
		c.journalFailed(op, err)
	}
	if rec.Terminal() {
		c.pruneOps()
	}
	return err
}

func (c *Coordinator) journalFailed(op *opstate.Op, err error) {
	c.log.Error("journal", "operation", op.Rec.ID, "err", err)
	op.Emit("journal", "", "journal write failed: "+err.Error(), true, nil)
}

// maxPrunedIDs bounds the memory of pruned ids (for Status's message).
const maxPrunedIDs = 10000

// pruneOps drops from memory the finished operations the journal drops
// (Prunable with the same keep), so that memory is bounded like the
// journal. The operation running, if any, is never dropped.
func (c *Coordinator) pruneOps() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var recs []Record
	for id, op := range c.ops {
		op.Mu.Lock()
		rec, running := op.Rec, op.Running
		op.Mu.Unlock()
		if running || op == c.current || id == c.lastID {
			continue
		}
		recs = append(recs, rec)
	}
	// lastID is not a candidate but counts as kept.
	keep := c.cfg.KeptOperations()
	if last, ok := c.ops[c.lastID]; ok && last.Rec.Terminal() {
		keep--
	}
	if c.pruned == nil || len(c.pruned) > maxPrunedIDs {
		c.pruned = map[string]bool{}
	}
	for _, r := range Prunable(recs, keep) {
		delete(c.ops, r.ID)
		c.pruned[r.ID] = true
	}
}
