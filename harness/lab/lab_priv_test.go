package lab_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
)

var ovsBins = []string{"ip", "bridge", "iptables", "iptables-restore", "iptables-save", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl"}

// newConfig returns a config with a random lab name (so parallel tests and
// packages never collide) and a short dir under the test's temp dir.
func newConfig(t *testing.T, backend string, nodes int) lab.Config {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "t" + hex.EncodeToString(b)
	// t.TempDir paths can be long; unix sockets under the lab dir cannot.
	dir, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return lab.Config{Name: name, Nodes: nodes, Backend: backend, Dir: filepath.Join(dir, name)}
}

func up(t *testing.T, cfg lab.Config) *lab.Lab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Up of %d %s nodes took %s", cfg.Nodes, cfg.Backend, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
	})
	return l
}

// wantMesh checks reachability: every ordered pair is ok unless it involves
// a node in broken, which must FAIL.
func wantMesh(t *testing.T, l *lab.Lab, broken map[string]bool, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := l.Mesh(ctx, timeout)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, a := range l.Nodes() {
		for _, b := range l.Nodes() {
			if a.Name == b.Name {
				continue
			}
			res := "ok"
			if broken[a.Name] != broken[b.Name] {
				res = "FAIL"
			}
			fmt.Fprintf(&want, "%s -> %s %s\n", a.Name, b.Name, res)
		}
	}
	if got := m.String(); got != want.String() {
		t.Fatalf("overlay mesh:\n%s\nwant:\n%s", got, want.String())
	}
}

func wantPorts(t *testing.T, l *lab.Lab, want map[string]int) {
	t.Helper()
	for _, n := range l.Nodes() {
		got, err := l.Port(context.Background(), n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got != want[n.Name] {
			t.Errorf("%s: port read back %d, want %d", n.Name, got, want[n.Name])
		}
	}
}

// wantGone asserts that Down left no namespace, no process and no file.
func wantGone(t *testing.T, cfg lab.Config, procs []lab.Proc) {
	t.Helper()
	left, err := netns.List("cot-lab-" + cfg.Name + "-")
	if err != nil || len(left) > 0 {
		t.Errorf("namespaces left after Down: %v %v", left, err)
	}
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("process left after Down: %s", p)
		}
	}
	if _, err := os.Stat(cfg.Dir); !os.IsNotExist(err) {
		t.Errorf("lab dir %s left after Down (stat: %v)", cfg.Dir, err)
	}
}

func setAll(t *testing.T, l *lab.Lab, port int, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		if err := l.SetPortDirect(context.Background(), n, port); err != nil {
			t.Fatal(err)
		}
	}
}

func names(l *lab.Lab) []string {
	var out []string
	for _, n := range l.Nodes() {
		out = append(out, n.Name)
	}
	return out
}

func portMap(l *lab.Lab, port int, except map[string]int) map[string]int {
	m := map[string]int{}
	for _, n := range l.Nodes() {
		m[n.Name] = port
		if p, ok := except[n.Name]; ok {
			m[n.Name] = p
		}
	}
	return m
}

// testBackend is the self-test of one backend: the overlay works, a port
// change on every node keeps it working, a change on one node cuts exactly
// that node off (which is the problem Cutover exists for), and Down leaves
// nothing behind.
func testBackend(t *testing.T, backend string, oldPort, newPort int) {
	cfg := newConfig(t, backend, 3)
	l := up(t, cfg)
	procs := l.Procs()
	if backend == lab.BackendOVS && len(procs) != 6 {
		t.Fatalf("recorded processes %v, want ovsdb-server and ovs-vswitchd on 3 nodes", procs)
	}
	wantPorts(t, l, portMap(l, oldPort, nil))
	wantMesh(t, l, nil, 5*time.Second)

	// The field report's step 3: open the new port on every node first
	// (on kernel-vxlan the lab's firewall drops it otherwise).
	for _, n := range names(l) {
		if err := l.OpenPortDirect(context.Background(), n, newPort); err != nil {
			t.Fatal(err)
		}
	}
	setAll(t, l, newPort, names(l)...)
	wantPorts(t, l, portMap(l, newPort, nil))
	wantMesh(t, l, nil, 5*time.Second)

	// Only n2 goes back: n2 is cut off from both others, n1↔n3 still work.
	setAll(t, l, oldPort, "n2")
	wantPorts(t, l, portMap(l, newPort, map[string]int{"n2": oldPort}))
	wantMesh(t, l, map[string]bool{"n2": true}, 1500*time.Millisecond)

	if err := l.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantGone(t, cfg, procs)
	if err := l.Down(context.Background()); err != nil {
		t.Fatalf("second Down: %v", err)
	}
}

func TestOVSLab(t *testing.T) {
	testenv.RequirePrivileged(t, ovsBins...)
	t.Parallel()
	testBackend(t, lab.BackendOVS, 4789, 4889)
}

func TestKernelVXLANLab(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "bridge", "iptables", "iptables-restore", "iptables-save")
	t.Parallel()
	testBackend(t, lab.BackendKernelVXLAN, 8472, 4889)
}
