package lab

import (
	"context"
	"errors"
	"os/exec"
	"strings"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// run is the one exec path of the lab's own configuration: ip and bridge
// batches. Batches keep a 64-node kernel-VXLAN lab (≈12k FDB, neighbor and
// route entries) to one exec per node instead of one per entry. A failure is
// an *execseam.Error naming the batch.
func run(ctx context.Context, stdin string, argv ...string) (string, error) {
	out, err := execseam.Run(exec.CommandContext(ctx, argv[0], argv[1:]...), stdin)
	return string(out), err
}

// ipBatch runs `ip` commands (one per line, without the leading "ip")
// inside namespace ns; the batch stops at the first failing line.
func ipBatch(ctx context.Context, ns string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	_, err := run(ctx, strings.Join(lines, "\n")+"\n", "ip", "-n", ns, "-batch", "-")
	return err
}

// bridgeBatch is ipBatch for the `bridge` tool (FDB entries).
func bridgeBatch(ctx context.Context, ns string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	_, err := run(ctx, strings.Join(lines, "\n")+"\n", "bridge", "-n", ns, "-batch", "-")
	return err
}

// ErrNotFound is returned (wrapped) by Load when no lab lives in a dir, and
// by lookups of unknown nodes.
var ErrNotFound = errors.New("not found")

// IsNotFound reports whether err means "no such lab or node".
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// ErrExists is returned (wrapped) by Up when the lab, or a leftover of it,
// is already there.
var ErrExists = errors.New("already exists")

// IsExists reports whether err means "the lab already exists".
func IsExists(err error) bool { return errors.Is(err, ErrExists) }
