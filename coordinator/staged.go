package coordinator

import (
	"time"
)

// The staged strategy (docs/staged.md): every node listens on both ports,
// the senders switch batch by batch with the probe mesh verified after
// each, then the old port is retired. The barrier core runs it
// (barrier.Config.Batches); internal/staging cuts the batches; this file
// settles strategy "auto" and stamps the report's batches as they pass.

// batchDone stamps batch b (1-based) of the report: switched (every node
// answered the switch) or verified (the mesh passed after it).
func (op *operation) batchDone(b int, at time.Time, verified bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	b += op.batchBase // a continued held operation's batches follow the earlier runs'
	if b < 1 || b > len(op.report.Batches) {
		return
	}
	if verified {
		op.report.Batches[b-1].VerifiedUnixNano = at.UnixNano()
	} else {
		op.report.Batches[b-1].SwitchedUnixNano = at.UnixNano()
	}
}
