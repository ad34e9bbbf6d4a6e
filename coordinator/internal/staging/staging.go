package staging

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// DefaultBatches is a canary, then everyone else.
var DefaultBatches = []string{"1", "100%"}

// ParseStrategy validates CutoverRequest.strategy: true for staged.
func ParseStrategy(s string) (bool, error) {
	switch s {
	case "", model.StrategyAtomic:
		return false, nil
	case model.StrategyStaged:
		return true, nil
	}
	return false, model.Invalid("strategy", fmt.Sprintf("%q", s), fmt.Sprintf("want %q (every node at one instant) or %q (listen on both, switch senders in batches, retire)", model.StrategyAtomic, model.StrategyStaged))
}

// PlanBatches cuts nodes (sorted) into batches from cumulative sizes: a
// count ("1") or a percentage of the nodes ("10%", rounded up), each
// larger than the one before (a size that rounds to the previous one is
// skipped: percentages of a small cluster collide), the last covering
// every node. Pure; every error names the field, the value and the
// reason.
func PlanBatches(specs []string, nodes []string) ([][]string, error) {
	if len(specs) == 0 {
		specs = DefaultBatches
	}
	n := len(nodes)
	var out [][]string
	prev := 0
	for i, spec := range specs {
		k, err := batchSize(spec, n)
		if err != nil {
			return nil, model.Invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), err.Error())
		}
		if k > n {
			return nil, model.Invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), fmt.Sprintf("%d nodes, but the operation targets %d", k, n))
		}
		if k < prev {
			return nil, model.Invalid(fmt.Sprintf("batches[%d]", i), fmt.Sprintf("%q", spec), fmt.Sprintf("covers %d nodes, fewer than the batch before (%d): sizes are cumulative and must grow", k, prev))
		}
		if k == prev {
			continue
		}
		out = append(out, nodes[prev:k])
		prev = k
	}
	if prev != n {
		return nil, model.Invalid("batches", fmt.Sprintf("%q", strings.Join(specs, ",")), fmt.Sprintf("the last batch covers %d of the %d nodes: end with 100%%", prev, n))
	}
	return out, nil
}

// batchSize is how many nodes spec covers out of n.
func batchSize(spec string, n int) (int, error) {
	s := strings.TrimSpace(spec)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 100 {
			return 0, fmt.Errorf("want a percentage in (0, 100]")
		}
		return int(math.Ceil(f * float64(n) / 100)), nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 {
		return 0, fmt.Errorf("want a node count (1 or more) or a percentage such as 10%%")
	}
	return k, nil
}

// WaveSize is how many nodes a staged phase changes at a time: the
// request's (capped at n), else a tenth of n rounded up. A node's listen,
// switch or retire reconfigures its datapath; on nodes that share CPUs (the
// lab: every node's userspace datapath on two cores) all of them at once
// starved each other and lost probes in the retire, one at a time lost
// none (docs/staged.md, Figures). Ten waves at most keeps a large
// cluster's phase short.
func WaveSize(req, n int) int {
	if n <= 0 {
		return 1
	}
	if req > 0 {
		return min(req, n)
	}
	return (n + 9) / 10
}

// Waves is how many rounds a phase over n nodes takes at k at a time.
func Waves(n, k int) int {
	if k <= 0 || n <= k {
		return 1
	}
	return (n + k - 1) / k
}

// Bounds is a staged step that changes nodes' datapaths (Prepare, Commit,
// Finalize) going out to n nodes at most k at a time: its bound covers
// every wave, and the dead-man a Commit carries grows as long, since a
// node of the first wave waits for the others before the batch is
// verified and confirmed.
func Bounds(n, k int, step, deadman time.Duration) (bound, commitDeadman time.Duration) {
	w := time.Duration(Waves(n, k))
	return step * w, deadman + (w-1)*step
}

// ReportBatches is the report's view of the batches.
func ReportBatches(bs [][]string) []*coordinatorv1.StagedBatch {
	out := make([]*coordinatorv1.StagedBatch, len(bs))
	for i, b := range bs {
		out[i] = &coordinatorv1.StagedBatch{Nodes: b}
	}
	return out
}
