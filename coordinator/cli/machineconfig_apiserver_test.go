package cli

// coordctl machineconfig against a real kube-apiserver (harness/kubetest)
// with the MCO's CRDs and stand-in daemons (harness/mcdsim): the flags,
// -o json, and every exit code the command documents.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/coordinator/machineconfig"
	"github.com/cutover-dev/cutover/harness/kubetest"
	"github.com/cutover-dev/cutover/harness/mcdsim"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

func TestMachineConfigCommands(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := os.ReadFile(filepath.Join("..", "machineconfig", "testdata", "crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, crds, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mcdsim.WaitServed(ctx, dyn, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: machineconfig.MCCNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mcdsim.Kubelet(ctx, cs, 50*time.Millisecond)
	f, err := mcdsim.NewPool(ctx, cs, dyn, "cli", 2)
	if err != nil {
		t.Fatal(err)
	}
	deg, err := mcdsim.NewPool(ctx, cs, dyn, "clideg", 1)
	if err != nil {
		t.Fatal(err)
	}
	kc := []string{"--kubeconfig", c.Kubeconfig, "--server", c.URL}

	t.Run("StatusJSON", func(t *testing.T) {
		code, out, errs := run(t, append([]string{"machineconfig", "status", "--pool", "cli", "-o", "json"}, kc...)...)
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var st machineconfig.PoolStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if st.SpecConfig != f.New || st.Newest != f.New || len(st.Nodes) != 2 || st.MCC.Alive ||
			st.Nodes[0].Current != f.Old || st.Nodes[0].Step != machineconfig.StepPending {
			t.Errorf("status: %+v", st)
		}
	})

	t.Run("StatusText", func(t *testing.T) {
		code, out, errs := run(t, append([]string{"machineconfig", "status", "--pool", "cli"}, kc...)...)
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		for _, want := range []string{
			"pool cli: spec config " + f.New + ", status config -, newest rendered " + f.New,
			"machine-config-controller: not alive (no Lease openshift-machine-config-operator/machine-config-controller)",
			"NODE ", "cli-0 ", "cli-1 ", "Pending", "uncordon-" + f.Old,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("status text lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("DryRunChangesNothing", func(t *testing.T) {
		code, out, errs := run(t, append([]string{"machineconfig", "rollout", "--pool", "cli", "--dry-run"}, kc...)...)
		if code != ExitOK || !strings.Contains(out, "DryRun") || !strings.Contains(out, "set-desired") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, f.Nodes[0], metav1.GetOptions{})
		if err != nil || n.Annotations[machineconfig.AnnoDesiredConfig] != f.Old {
			t.Errorf("dry run changed the node: %v %v", n.Annotations, err)
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"NoPool", []string{"rollout"}, "--pool: required"},
		{"UnknownPool", []string{"rollout", "--pool", "nosuch"}, `--pool "nosuch": no such MachineConfigPool`},
		{"ConfigOfAnotherPool", []string{"rollout", "--pool", "cli", "--config", deg.New}, `--config "` + deg.New + `": not a rendered MachineConfig of pool cli`},
		{"SelectorMatchesNoNode", []string{"rollout", "--pool", "cli", "--selector", "zone=nowhere"}, `--selector "zone=nowhere": matches no node of pool cli`},
		{"MaxUnavailableZero", []string{"rollout", "--pool", "cli", "--max-unavailable", "0"}, `--max-unavailable "0": must be at least 1`},
		{"NodesAndSelector", []string{"rollout", "--pool", "cli", "--nodes", "cli-0", "--selector", "a=b"}, "give one of them"},
		{"ServerNotHTTPS", []string{"rollout", "--pool", "cli", "--server", "198.18.0.1:6443"}, `--server "198.18.0.1:6443": want an https URL`},
	} {
		t.Run("BadInput"+tc.name, func(t *testing.T) {
			code, _, errs := run(t, append(append([]string{"machineconfig"}, kc...), tc.args...)...)
			if code != ExitUsage || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, ExitUsage, tc.want)
			}
		})
	}
	t.Run("Unreachable", func(t *testing.T) {
		code, _, errs := run(t, "machineconfig", "status", "--pool", "cli", "--kubeconfig", c.Kubeconfig, "--server", "https://127.0.0.1:1", "--timeout", "2s")
		if code != ExitUnreachable {
			t.Errorf("exit %d, stderr %q; want %d", code, errs, ExitUnreachable)
		}
	})
	t.Run("MCCAliveRefused", func(t *testing.T) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: machineconfig.MCCLease, Namespace: machineconfig.MCCNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("mcc-1"), LeaseDurationSeconds: ptr.To(int32(137)), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
		if _, err := cs.CoordinationV1().Leases(machineconfig.MCCNamespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = cs.CoordinationV1().Leases(machineconfig.MCCNamespace).Delete(ctx, l.Name, metav1.DeleteOptions{})
		}()
		code, _, errs := run(t, append([]string{"machineconfig", "rollout", "--pool", "cli"}, kc...)...)
		if code != ExitProblems || !strings.Contains(errs, "machine-config-controller looks alive") {
			t.Errorf("exit %d, stderr %q; want %d", code, errs, ExitProblems)
		}
	})
	t.Run("DegradedFails", func(t *testing.T) {
		if _, err := mcdsim.Start(ctx, cs, deg.Nodes[0], mcdsim.Options{Mode: mcdsim.Degraded, Reason: "failed to run nmstatectl"}); err != nil {
			t.Fatal(err)
		}
		code, out, errs := run(t, append([]string{"machineconfig", "rollout", "--pool", "clideg", "--poll", "50ms"}, kc...)...)
		if code != ExitOpFailed || !strings.Contains(errs, "failed to run nmstatectl") || !strings.Contains(out, "Failed") {
			t.Errorf("exit %d, stdout %q, stderr %q; want %d and the MCD's reason", code, out, errs, ExitOpFailed)
		}
	})
	t.Run("RolloutJSON", func(t *testing.T) {
		for _, n := range f.Nodes {
			if _, err := mcdsim.Start(ctx, cs, n, mcdsim.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		code, out, errs := run(t, append([]string{"machineconfig", "rollout", "--pool", "cli", "--poll", "50ms", "-o", "json"}, kc...)...)
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var rep machineconfig.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if rep.State != machineconfig.RolloutSucceeded || len(rep.Nodes) != 2 || rep.Nodes[1].Current != f.New {
			t.Errorf("report: %+v", rep)
		}
		if !strings.Contains(errs, "cli-0") || !strings.Contains(errs, "answered lastAppliedDrain=drain-"+f.New) {
			t.Errorf("no live progress on stderr: %q", errs)
		}
	})
}
