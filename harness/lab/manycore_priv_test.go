package lab_test

import (
	"encoding/json"
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
// namespace).
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
		"COT_LAB_BENCH_METHODS=limit,cutover", "COT_LAB_BENCH_BACKENDS=ovs,kernel-vxlan")
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
}
