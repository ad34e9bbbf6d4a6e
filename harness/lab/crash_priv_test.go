package lab_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/testenv"
)

// TestHelperUp is not a test: the crash tests re-run the test binary with
// it, so that Up runs in a process they can SIGKILL.
func TestHelperUp(t *testing.T) {
	raw := os.Getenv("COT_LAB_HELPER_CONFIG")
	if raw == "" {
		t.Skip("helper process for the crash tests")
	}
	var cfg lab.Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := lab.Up(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("LAB-UP\n")
	time.Sleep(time.Minute) // until SIGKILL
}

func startHelper(t *testing.T, cfg lab.Config) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUp$", "-test.v")
	cmd.Env = append(os.Environ(), "COT_LAB_HELPER_CONFIG="+string(raw))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// A process runs Up and is killed -9; a fresh Load finds the lab, whose
// OVS daemons outlived their parent and still carry the overlay, and Down
// removes everything by the record alone.
func TestCrashThenLoadDown(t *testing.T) {
	testenv.RequirePrivileged(t, ovsBins...)
	t.Parallel()
	cfg := newConfig(t, lab.BackendOVS, 3)
	cmd, sc := startHelper(t, cfg)
	for sc.Scan() && !strings.Contains(sc.Text(), "LAB-UP") {
	}
	kill9(t, cmd)

	l, err := lab.Load(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Down(context.Background()) })
	procs := l.Procs()
	if len(procs) != 6 {
		t.Fatalf("recorded processes %v, want 6", procs)
	}
	for _, p := range procs {
		if !p.Alive() {
			t.Fatalf("%s died with the process that ran Up", p)
		}
	}
	wantMesh(t, l, nil, 5*time.Second)
	if got, err := l.Exec(context.Background(), "n1", "ovs-vsctl", "get", "interface", "vxlan0", "ofport"); err != nil || strings.TrimSpace(got) != "1" {
		t.Fatalf("Exec ovs-vsctl in n1: %q %v, want ofport 1", got, err)
	}
	if err := l.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantGone(t, cfg, procs)
}

// The process running Up is killed half way (some OVS instances up, maybe
// one mid-start with its PIDs unrecorded): Teardown by name still removes
// everything, sweeping the lab's namespaces for unrecorded processes.
func TestCrashMidUpTeardown(t *testing.T) {
	testenv.RequirePrivileged(t, ovsBins...)
	t.Parallel()
	cfg := newConfig(t, lab.BackendOVS, 6)
	cfg.Parallel = 1
	cmd, _ := startHelper(t, cfg)
	// Wait until at least one node's OVS is recorded, then kill.
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, _ := os.ReadFile(filepath.Join(cfg.Dir, lab.StateFile))
		var st struct{ Procs []lab.Proc }
		if json.Unmarshal(data, &st) == nil && len(st.Procs) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("helper recorded no process in 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	kill9(t, cmd)
	// A process nobody recorded, as if spawned just before the crash.
	stray := exec.Command("ip", "netns", "exec", lab.HubNetns(cfg.Name), "sleep", "300")
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	strayDone := make(chan error, 1)
	go func() { strayDone <- stray.Wait() }()
	t.Cleanup(func() { _ = stray.Process.Kill() })
	l, err := lab.Load(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	procs := l.Procs()
	// Everything running in the lab's namespaces, recorded or not, must go.
	var pids []string
	for i := 0; i <= cfg.Nodes; i++ {
		ns := lab.NodeNetns(cfg.Name, i)
		if i == 0 {
			ns = lab.HubNetns(cfg.Name)
		}
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		pids = append(pids, strings.Fields(string(out))...)
	}
	t.Logf("recorded %d processes, %d running in the lab's namespaces", len(procs), len(pids))
	if err := lab.Teardown(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	wantGone(t, cfg, procs)
	select {
	case <-strayDone:
	case <-time.After(5 * time.Second):
		t.Error("unrecorded process in the hub namespace survived Teardown")
	}
	for _, pid := range pids {
		// A zombie (killed, not yet reaped by init) counts as gone.
		if st, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
			t.Errorf("pid %s from a lab namespace still runs after Teardown: %s", pid, st)
		}
	}
	if err := lab.Teardown(context.Background(), cfg); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
}
