package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/harness/fakeagent"
	"github.com/cutover-dev/cutover/pkg/pki"
)

// TestStatusOfPrunedOperation runs cutovers through coordctl and the real
// coordinator with --journal-keep 2: the oldest operation leaves the
// journal directory and the coordinator's memory, and `coordctl status`
// of it says it was pruned, also after a restart on the same state dir.
func TestStatusOfPrunedOperation(t *testing.T) {
	dir := certsDir(t)
	var specs []coordinator.AgentSpec
	for _, n := range []string{"n1", "n2"} {
		specs = append(specs, coordinator.AgentSpec{Node: n, Address: serveFakeAgent(t, dir, n, fakeagent.New(n, 4789))})
	}
	inv, err := coordinator.NewInventory("test", specs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Default()
	cfg.StateDir = t.TempDir()
	cfg.TLS = pki.CoordinatorFiles(dir)
	cfg.StepTimeout = 2 * time.Second
	cfg.Deadman = 5 * time.Second
	cfg.JournalKeep = 2

	// start serves a coordinator on the state dir until stop.
	start := func() (ctl func(args ...string) (int, string, string), stop func()) {
		c, err := coordinator.New(cfg, inv, coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv, addr := serveMTLS(t, c, dir)
		base := []string{"--coordinator", addr, "--tls-dir", dir}
		return func(args ...string) (int, string, string) {
			t.Helper()
			return run(t, append(append([]string{}, base...), args...)...)
		}, func() { srv.Stop(); c.Close() }
	}
	ctl, stop := start()
	idRe := regexp.MustCompile(`"operation_id":\s*"([^"]+)"`)
	var ids []string
	for _, port := range []string{"4889", "4989", "5089"} {
		if code, stdout, stderr := ctl("cutover", "--port", port, "--timeout", "2s"); code != ExitOK {
			t.Fatalf("cutover to %s: exit %d\n%s\n%s", port, code, stdout, stderr)
		}
		_, stdout, _ := ctl("status", "-o", "json")
		m := idRe.FindStringSubmatch(stdout)
		if m == nil {
			t.Fatalf("no operation_id in status:\n%s", stdout)
		}
		ids = append(ids, m[1])
	}
	files, err := filepath.Glob(filepath.Join(cfg.StateDir, "operations", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, f := range files {
		kept = append(kept, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	if len(kept) != 2 || strings.Contains(strings.Join(kept, ","), ids[0]) {
		t.Errorf("journal holds %v after 3 operations with --journal-keep 2, want %s and %s", kept, ids[1], ids[2])
	}
	for _, id := range ids[1:] {
		if code, stdout, stderr := ctl("status", id); code != ExitOK {
			t.Errorf("status %s (kept): exit %d\n%s\n%s", id, code, stdout, stderr)
		}
	}
	code, _, stderr := ctl("status", ids[0])
	if code != ExitUsage || !strings.Contains(stderr, "pruned: it ended and the journal keeps only the last 2 finished operations (--journal-keep)") {
		t.Errorf("status of the pruned %s: exit %d: %s", ids[0], code, stderr)
	}
	stop()

	// Restarted on the same state dir: the pruned id is unknown, and the
	// message still names pruning.
	ctl, stop = start()
	defer stop()
	code, _, stderr = ctl("status", ids[0])
	if code != ExitUsage || !strings.Contains(stderr, "one older than those was pruned") {
		t.Errorf("status of the pruned %s after a restart: exit %d: %s", ids[0], code, stderr)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "operations", ids[2]+".json")); err != nil {
		t.Errorf("newest operation's record: %v", err)
	}
}
