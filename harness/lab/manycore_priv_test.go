package lab_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// TestManycoreBundle makes the bundle that travels to the many-core machine
// (hack/manycore-bundle.sh) and runs the benchmark from it the way that
// machine does (hack/manycore-run.sh), with PATH holding the bundle's tools
// alone: a tool the lab, the agents or OVS run that the bundle lacks fails
// here, not in the few minutes a lent machine lasts. A small run: 4 nodes,
// one round of the limit and the atomic cutover on both backends (the
// kernel limit re-runs the bundle's test binary in every node's
// namespace), then the agent's footprint probing at the default rate over
// a 3 s window (the wake floor re-runs it too).
func TestManycoreBundle(t *testing.T) {
	testenv.RequirePrivileged(t, append(ovsBins, "go", "git", "xz", "ldd", "nft", "conntrack", "ethtool", "ping", "ss", "tc", "flock", "nsenter")...)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle")
	out, err := exec.Command(filepath.Join(root, "hack/manycore-bundle.sh"), bundle).CombinedOutput()
	if err != nil {
		t.Fatalf("manycore-bundle.sh: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	commit, err := os.ReadFile(filepath.Join(bundle, "COMMIT"))
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(filepath.Join(root, "hack/manycore-run.sh"))
	run.Env = append(os.Environ(), "COT_MANYCORE_BUNDLE="+bundle, "COT_MANYCORE_STRICT=1", "COT_MANYCORE_SIZES=4",
		"COT_MANYCORE_ROUNDS=1", "COT_MANYCORE_TIMEOUT=5m", "OUT="+filepath.Join(dir, "out"), "CUTOVER_RESULTS="+filepath.Join(dir, "results"),
		"COT_LAB_BENCH_METHODS=limit,cutover", "COT_LAB_BENCH_BACKENDS=ovs,kernel-vxlan",
		"COT_MANYCORE_BENCH=lab footprint", "COT_MANYCORE_FOOTPRINT_ROUNDS=1", "COT_MANYCORE_FOOTPRINT_PROBES=probing", "COT_FOOTPRINT_WINDOW=3s")
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("manycore-run.sh with the bundle's tools alone: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "out", "lab_cutover_n4_manycore.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Provenance struct{ Commit, Tool string }
		Summary    []struct {
			Backend, Method string
			Nodes           int
		}
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Provenance.Commit != strings.TrimSpace(string(commit)) || !strings.Contains(res.Provenance.Tool, "manycore-run.sh") {
		t.Errorf("provenance %+v: want the bundle's commit %s and the run script as the tool", res.Provenance, commit)
	}
	var got []string
	for _, s := range res.Summary {
		if s.Nodes == 4 {
			got = append(got, s.Backend+"/"+s.Method)
		}
	}
	if strings.Join(got, " ") != "ovs/limit ovs/cutover kernel-vxlan/limit kernel-vxlan/cutover" {
		t.Errorf("rows %v: want the limit and the cutover on both backends, at N=4", got)
	}
	// The agent's footprint, this tree's agent alone (no Go there to
	// build the base), beside the wake floor and a syscall's cost.
	data, err = os.ReadFile(filepath.Join(dir, "out", "agent_footprint_manycore.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fp struct {
		Provenance    struct{ Commit, Tool string }
		Base          string
		NullSyscallNS []float64 `json:"null_syscall_ns"`
		Figures       []footprintFigure
		Summary       []footprintSummary
	}
	if err := json.Unmarshal(data, &fp); err != nil {
		t.Fatal(err)
	}
	if fp.Provenance.Commit != strings.TrimSpace(string(commit)) || !strings.Contains(fp.Provenance.Tool, "manycore-run.sh") || fp.Base != footprintBaseNone {
		t.Errorf("footprint provenance %+v, base %q: want the bundle's commit %s, the run script, no base", fp.Provenance, fp.Base, commit)
	}
	if len(fp.NullSyscallNS) != 2 || fp.NullSyscallNS[0] <= 0 || fp.NullSyscallNS[1] <= 0 {
		t.Errorf("null_syscall_ns %v: want the cost before the rows and after", fp.NullSyscallNS)
	}
	if len(fp.Figures) != 2 || fp.Figures[0].Probes != "probing" || fp.Figures[0].Agent != "this" ||
		fp.Figures[0].CPUMedianPct <= 0 || fp.Figures[0].WakeFloorPct <= 0 || fp.Figures[0].PacketCost == nil {
		t.Errorf("footprint rows %+v: want this agent probing first, with its CPU, the wake floor and the packet cost", fp.Figures)
	} else if f := fp.Figures[1]; f.Agent != meshFloorAgent || f.CPUMedianPct <= 0 || f.PacketsPerSec < 200 {
		t.Errorf("footprint row %+v: want the mesh floor's, its nodes sending 3 datagrams every 10 ms", f)
	}
	if len(fp.Summary) != 2 || fp.Summary[0].Agent != "this" || fp.Summary[1].Agent != meshFloorAgent {
		t.Errorf("footprint summary %+v: want this agent's and the mesh floor's", fp.Summary)
	}
	// A bench the script does not know is refused by name, before anything runs.
	bad := exec.Command(filepath.Join(root, "hack/manycore-run.sh"))
	bad.Env = append(os.Environ(), "COT_MANYCORE_BUNDLE="+bundle, "COT_MANYCORE_BENCH=lab pingpong", "OUT="+filepath.Join(dir, "bad"))
	out, err = bad.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `COT_MANYCORE_BENCH="lab pingpong": pingpong`) {
		t.Errorf("COT_MANYCORE_BENCH=lab pingpong: %v\n%s\nwant exit 2 naming the value", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad")); err == nil {
		t.Error("COT_MANYCORE_BENCH=lab pingpong: the script made its output directory before refusing")
	}
}
