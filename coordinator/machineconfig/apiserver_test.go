package machineconfig

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/mcdsim"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestRolloutOnAPIServer runs the rollout against a real kube-apiserver; the
// subtests share it, each with its own pool and nodes.
func TestRolloutOnAPIServer(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mcdsim.Kubelet(ctx, e.cs, 50*time.Millisecond)

	t.Run("Seeds001SequenceOneAtATime", func(t *testing.T) { testSequence(t, e) })
	t.Run("MaxUnavailableTwo", func(t *testing.T) { testMaxUnavailable(t, e) })
	t.Run("RebootlessUncordoned", func(t *testing.T) { testRebootless(t, e) })
	t.Run("NotReadyNodesRoll", func(t *testing.T) { testNotReady(t, e) })
	t.Run("DegradedStops", func(t *testing.T) { testDegraded(t, e) })
	t.Run("SilentNodeTimesOut", func(t *testing.T) { testSilent(t, e) })
	t.Run("DrainHonoursPDB", func(t *testing.T) { testPDB(t, e) })
	t.Run("DrainTimeoutNamesNodeAndPod", func(t *testing.T) { testDrainTimeout(t, e) })
	t.Run("ResumeRefusesAnotherConfig", func(t *testing.T) { testResumeOtherConfig(t, e) })
	t.Run("EmptyDirRefusedUnlessAllowed", func(t *testing.T) { testEmptyDir(t, e) })
	t.Run("ResumeAtEachStep", func(t *testing.T) { testResume(t, e) })
	t.Run("SecondDriverConflicts", func(t *testing.T) { testTwoDrivers(t, e) })
	t.Run("MCCAliveRefusal", func(t *testing.T) { testMCCAlive(t, e) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, e) })
	t.Run("DryRun", func(t *testing.T) { testDryRun(t, e) })
}

func testSequence(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "seq", 3)
	for _, n := range f.nodes {
		e.pod(t, "default", "work-"+n, n, nil)
	}
	rec := e.record(t, ctx, f)
	guard := e.guardDrains(t, ctx, f)
	mcds := e.daemons(t, ctx, f, nil)
	rep, err := e.d.Rollout(ctx, e.options(f))
	if err != nil {
		t.Fatalf("rollout: %v", err)
	}
	if rep.State != RolloutSucceeded || rep.Config != f.new {
		t.Fatalf("report: state %s config %s", rep.State, rep.Config)
	}
	want := seeds001(f.new)
	for _, n := range f.nodes {
		if got := rec.wait(n, want[len(want)-1]); !slices.Equal(got, want) {
			t.Errorf("node %s: annotation sequence\n got %q\nwant %q", n, got, want)
		}
		if r := mcds[n].Reboots(); r != 1 {
			t.Errorf("node %s rebooted %d times, want 1", n, r)
		}
	}
	// One node at a time: each node starts after the previous one is done.
	order := rec.order()
	for i := 1; i < len(f.nodes); i++ {
		prevDone := slices.Index(order, f.nodes[i-1]+" currentConfig="+f.new)
		start := slices.Index(order, f.nodes[i]+" desiredConfig="+f.new)
		if prevDone < 0 || start < prevDone {
			t.Errorf("max-unavailable 1: %s started (event %d) before %s was done (event %d)", f.nodes[i], start, f.nodes[i-1], prevDone)
		}
	}
	for _, nr := range rep.Nodes {
		if nr.Step != StepDone || !nr.SawReboot {
			t.Errorf("report node %s: step %s sawReboot %t", nr.Name, nr.Step, nr.SawReboot)
		}
	}
	if j := e.journal(t, f.pool); j == nil || j.State != RolloutSucceeded {
		t.Errorf("journal: %+v", j)
	}
	if err := guard.err(); err != nil {
		t.Error(err)
	}
}

func testMaxUnavailable(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "max2", 3)
	rec := e.record(t, ctx, f)
	e.daemons(t, ctx, f, nil)
	o := e.options(f)
	o.MaxUnavailable = "67%" // 2 of 3
	rep, err := e.d.Rollout(ctx, o)
	if err != nil {
		t.Fatalf("rollout: %v", err)
	}
	if rep.MaxUnavailable != 2 {
		t.Errorf("67%% of 3 nodes: max unavailable %d, want 2", rep.MaxUnavailable)
	}
	order := rec.order()
	d0 := slices.Index(order, f.nodes[0]+" currentConfig="+f.new)
	s1 := slices.Index(order, f.nodes[1]+" desiredConfig="+f.new)
	s2 := slices.Index(order, f.nodes[2]+" desiredConfig="+f.new)
	d1 := slices.Index(order, f.nodes[1]+" currentConfig="+f.new)
	if s1 < 0 || s1 > d0 {
		t.Errorf("the second node should start with the first: order %q", order)
	}
	if s2 < min(d0, d1) {
		t.Errorf("the third node started while two were in progress: order %q", order)
	}
}

// testRebootless: an MCD that applies without a reboot writes
// currentConfig, Done and uncordon-<config> at once; the node must still
// be uncordoned and the request answered before it counts as done.
func testRebootless(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "rebootless", 1)
	rec := e.record(t, ctx, f)
	mcds := e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[0]: {Mode: mcdsim.Rebootless}})
	if _, err := e.d.Rollout(ctx, e.options(f)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"desiredConfig=" + f.new,
		"desiredDrain=" + DrainRequest(f.new),
		"unschedulable=true",
		"lastAppliedDrain=" + DrainRequest(f.new),
		"desiredDrain=" + UncordonRequest(f.new), "currentConfig=" + f.new, // one update
		"unschedulable=false",
		"lastAppliedDrain=" + UncordonRequest(f.new),
	}
	if got := rec.wait(f.nodes[0], want[len(want)-1]); !slices.Equal(got, want) {
		t.Errorf("annotation sequence\n got %q\nwant %q", got, want)
	}
	if r := mcds[f.nodes[0]].Reboots(); r != 0 {
		t.Errorf("rebootless update rebooted %d times", r)
	}
}

// testNotReady: every node NotReady at the start (the CNI is down, the
// kubelets report NetworkNotReady, as when the SDN broke) must not block the rollout.
func testNotReady(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "notready", 2)
	for _, n := range f.nodes {
		if err := mcdsim.SetReady(ctx, e.cs, n, corev1.ConditionFalse); err != nil {
			t.Fatal(err)
		}
	}
	mcds := e.daemons(t, ctx, f, nil)
	rep, err := e.d.Rollout(ctx, e.options(f))
	if err != nil || rep.State != RolloutSucceeded {
		t.Fatalf("rollout of NotReady nodes: %v", err)
	}
	for _, n := range f.nodes {
		if r := mcds[n].Reboots(); r != 1 {
			t.Errorf("node %s rebooted %d times, want 1", n, r)
		}
	}
}

func testDegraded(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "deg", 3)
	const reason = `unexpected on-disk state validating against rendered-deg-0ld: content mismatch for file "/etc/chrony.conf"`
	e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[1]: {Mode: mcdsim.Degraded, Reason: reason}})
	rep, err := e.d.Rollout(ctx, e.options(f))
	var fe *FailedError
	if !errors.As(err, &fe) || fe.Node != f.nodes[1] || fe.State != StateDegraded || fe.Reason != reason {
		t.Fatalf("want the MCD's Degraded reason for %s, got %v", f.nodes[1], err)
	}
	if !strings.Contains(err.Error(), reason) || rep.State != RolloutFailed {
		t.Errorf("error %q / state %s", err, rep.State)
	}
	// The degraded node is left as it is (desiredConfig set, never
	// drained), the next one never started.
	n1, _ := e.cs.CoreV1().Nodes().Get(ctx, f.nodes[1], metav1.GetOptions{})
	if v := ViewOf(n1); v.Desired != f.new || v.Unschedulable || v.LastAppliedDrain != UncordonRequest(f.old) {
		t.Errorf("degraded node changed: %+v", v)
	}
	n2, _ := e.cs.CoreV1().Nodes().Get(ctx, f.nodes[2], metav1.GetOptions{})
	if v := ViewOf(n2); v.Desired != f.old {
		t.Errorf("a node after the degraded one was started: %+v", v)
	}
	if j := e.journal(t, f.pool); j.State != RolloutFailed || !strings.Contains(j.Error, reason) {
		t.Errorf("journal: %+v", j)
	}

	// The operator fixes the node (the MCD restarts healthy) and runs the
	// rollout again: it resumes and finishes, with the same target.
	cancel()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if err := e.annotate(ctx2, f.nodes[1], map[string]string{AnnoState: StateWorking, AnnoReason: ""}); err != nil {
		t.Fatal(err)
	}
	e.daemons(t, ctx2, f, nil)
	rep, err = e.d.Rollout(ctx2, e.options(f))
	if err != nil || !rep.Resumed || rep.State != RolloutSucceeded {
		t.Fatalf("after the fix: %v (resumed %t)", err, rep != nil && rep.Resumed)
	}
}

func testSilent(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "silent", 2)
	e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[0]: {Mode: mcdsim.Silent}})
	o := e.options(f)
	o.Timeouts.MCD = 2 * time.Second
	_, err := e.d.Rollout(ctx, o)
	var te *TimeoutError
	if !errors.As(err, &te) || te.Node != f.nodes[0] || te.Step != StepWaitDrainRequest {
		t.Fatalf("want a timeout naming %s at %s, got %v", f.nodes[0], StepWaitDrainRequest, err)
	}
	if !strings.Contains(err.Error(), f.nodes[0]) {
		t.Errorf("error does not name the node: %v", err)
	}
}

func (e *env) pod(t *testing.T, ns, name, node string, mutate func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
	}
	if mutate != nil {
		mutate(p)
	}
	out, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (e *env) podExists(t *testing.T, ns, name string) bool {
	t.Helper()
	_, err := e.cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

func testPDB(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "pdb", 1)
	node := f.nodes[0]
	const ns = "default"
	guarded := e.pod(t, ns, "guarded", node, func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "guarded-rs", UID: "11111111-1111-1111-1111-111111111111", Controller: ptr.To(true)}}
	})
	// The Eviction API ignores PDBs for pods that are not Running (a bare
	// apiserver leaves them Pending): report it Running and Ready, as its
	// kubelet would.
	guarded.Status.Phase = corev1.PodRunning
	guarded.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := e.cs.CoreV1().Pods(ns).UpdateStatus(ctx, guarded, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.pod(t, ns, "ds-pod", node, func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "22222222-2222-2222-2222-222222222222", Controller: ptr.To(true)}}
	})
	e.pod(t, ns, "static-"+node, node, func(p *corev1.Pod) {
		p.Annotations = map[string]string{"kubernetes.io/config.mirror": "abc"}
	})
	pdb, err := e.cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No disruption controller runs here: the test plays it. With the only
	// guarded pod on the node, minAvailable 1 allows no disruption.
	setPDB := func(allowed, healthy int32) {
		t.Helper()
		p, err := e.cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: p.Generation, DisruptionsAllowed: allowed,
			CurrentHealthy: healthy, DesiredHealthy: 1, ExpectedPods: healthy}
		if _, err := e.cs.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPDB(0, 1)
	guard := e.guardDrains(t, ctx, f)
	e.daemons(t, ctx, f, nil)
	var refused atomic.Int32
	blocked := make(chan struct{})
	o := e.options(f)
	o.Progress = func(ev Event) {
		if strings.Contains(ev.Msg, "eviction of default/guarded refused") && refused.Add(1) == 1 {
			close(blocked)
		}
	}
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() { r, err := e.d.Rollout(ctx, o); done <- result{r, err} }()
	select {
	case <-blocked:
	case r := <-done:
		t.Fatalf("rollout ended before the PDB blocked the eviction: %v", r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the eviction was never refused by the PDB")
	}
	// Blocked: the guarded pod stays and the drain is not answered.
	time.Sleep(500 * time.Millisecond)
	if !e.podExists(t, ns, "guarded") {
		t.Fatal("the guarded pod was removed despite its PDB")
	}
	n, _ := e.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if v := ViewOf(n); v.LastAppliedDrain == DrainRequest(f.new) || !v.Unschedulable {
		t.Fatalf("drain answered (or node not cordoned) while the PDB blocks: %+v", v)
	}
	// A replacement became healthy elsewhere: the budget allows one.
	setPDB(1, 2)
	r := <-done
	if r.err != nil {
		t.Fatalf("rollout: %v", r.err)
	}
	if e.podExists(t, ns, "guarded") {
		t.Error("the guarded pod was not evicted once the PDB allowed it")
	}
	for _, p := range []string{"ds-pod", "static-" + node} {
		if !e.podExists(t, ns, p) {
			t.Errorf("%s was evicted: DaemonSet and mirror pods must be skipped", p)
		}
	}
	if err := guard.err(); err != nil {
		t.Error(err)
	}
}

func testDrainTimeout(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "stuck", 1)
	node := f.nodes[0]
	p := e.pod(t, "default", "stuck-guarded", node, nil)
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := e.cs.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb, err := e.cs.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "stuck"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "stuck-guarded"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if _, err := e.cs.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.daemons(t, ctx, f, nil)
	o := e.options(f)
	o.Timeouts.Drain = 2 * time.Second
	rep, err := e.d.Rollout(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "node "+node+": drain timed out") || !strings.Contains(err.Error(), "default/stuck-guarded") {
		t.Fatalf("want a drain timeout naming %s and the guarded pod, got %v", node, err)
	}
	if rep.State != RolloutFailed || !e.podExists(t, "default", "stuck-guarded") {
		t.Errorf("state %s; the guarded pod must stay", rep.State)
	}
	n, _ := e.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if v := ViewOf(n); v.LastAppliedDrain == DrainRequest(f.new) {
		t.Error("the drain was answered although it timed out")
	}
}

func testResumeOtherConfig(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "retarget", 1)
	e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[0]: {Mode: mcdsim.Silent}})
	dctx, kill := context.WithCancel(ctx)
	o := e.options(f)
	o.Progress = func(ev Event) {
		if strings.HasPrefix(ev.Msg, "set desiredConfig") {
			kill()
		}
	}
	if _, err := e.d.Rollout(dctx, o); !errors.Is(err, context.Canceled) {
		t.Fatalf("first driver: %v", err)
	}
	o.Progress = nil
	o.Config = f.old
	_, err := e.d.Rollout(ctx, o)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Field != "--config" || !strings.Contains(ie.Reason, "is in progress") {
		t.Fatalf("a second target while one is journaled Running: got %v", err)
	}
}

func testEmptyDir(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "empty", 1)
	node := f.nodes[0]
	e.pod(t, "default", "scratch", node, func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	})
	e.daemons(t, ctx, f, nil)
	_, err := e.d.Rollout(ctx, e.options(f))
	var dr *DrainRefusedError
	if !errors.As(err, &dr) || dr.Node != node || !slices.Equal(dr.Pods, []string{"default/scratch"}) {
		t.Fatalf("want the drain refused for default/scratch, got %v", err)
	}
	if !e.podExists(t, "default", "scratch") {
		t.Fatal("the emptyDir pod was evicted without --delete-emptydir-data")
	}
	o := e.options(f)
	o.Drain.DeleteEmptyDirData = true
	rep, err := e.d.Rollout(ctx, o)
	if err != nil || !rep.Resumed {
		t.Fatalf("rollout with --delete-emptydir-data: %v (resumed %v)", err, rep != nil && rep.Resumed)
	}
	if e.podExists(t, "default", "scratch") {
		t.Error("the emptyDir pod was not evicted with --delete-emptydir-data")
	}
}

// testResume kills the driver (cancels its context) at each step and
// checks a new driver finishes with the exact sequence of seeds001 and one
// reboot: nothing repeated, no drain skipped.
func testResume(t *testing.T, e *env) {
	for i, kill := range []struct {
		name string
		at   func(Event) bool
	}{
		{"AfterSetDesired", func(ev Event) bool { return strings.HasPrefix(ev.Msg, "set desiredConfig") }},
		{"MidDrainAfterCordon", func(ev Event) bool { return ev.Msg == "cordoned" }},
		{"AfterDrainAnswered", func(ev Event) bool { return strings.HasPrefix(ev.Msg, "drained; answered") }},
		{"DuringReboot", func(ev Event) bool { return strings.HasPrefix(ev.Msg, "NotReady") }},
		{"MidUncordonBeforeAnswer", func(ev Event) bool { return ev.Msg == "uncordoned" }},
		{"AfterUncordonAnswered", func(ev Event) bool { return strings.HasPrefix(ev.Msg, "answered lastAppliedDrain=uncordon") }},
	} {
		t.Run(kill.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := e.pool(t, "resume"+string(rune('a'+i)), 1)
			e.pod(t, "default", "work-"+f.nodes[0], f.nodes[0], nil)
			rec := e.record(t, ctx, f)
			guard := e.guardDrains(t, ctx, f)
			// A 2 s reboot: the driver, polling every 50 ms, must see the
			// NotReady to be killed during it, even on a loaded machine.
			mcds := e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[0]: {Reboot: 2 * time.Second}})
			dctx, kill1 := context.WithCancel(ctx)
			killed := false
			o := e.options(f)
			o.Progress = func(ev Event) {
				if !killed && kill.at(ev) {
					killed = true
					kill1()
				}
			}
			rep, err := e.d.Rollout(dctx, o)
			if !errors.Is(err, context.Canceled) || !killed {
				t.Fatalf("first driver: want killed, got %v (killed %t)", err, killed)
			}
			if rep.State != RolloutRunning {
				t.Errorf("killed driver's report: state %s", rep.State)
			}
			if j := e.journal(t, f.pool); j.State != RolloutRunning {
				t.Errorf("journal after the kill: %s", j.State)
			}
			o.Progress = nil
			rep, err = e.d.Rollout(ctx, o)
			if err != nil || !rep.Resumed || rep.State != RolloutSucceeded {
				t.Fatalf("second driver: %v (resumed %t)", err, rep != nil && rep.Resumed)
			}
			want := seeds001(f.new)
			if got := rec.wait(f.nodes[0], want[len(want)-1]); !slices.Equal(got, want) {
				t.Errorf("annotation sequence\n got %q\nwant %q", got, want)
			}
			if r := mcds[f.nodes[0]].Reboots(); r != 1 {
				t.Errorf("rebooted %d times, want 1", r)
			}
			if e.podExists(t, "default", "work-"+f.nodes[0]) {
				t.Error("the node's pod was not evicted: the drain was skipped")
			}
			if err := guard.err(); err != nil {
				t.Error(err)
			}
		})
	}
}

// testTwoDrivers: a second driver started on the same pool mid-rollout.
// The journal's optimistic concurrency stops one of them with
// ErrJournalConflict at its next write; the other finishes, and the node
// still sees the exact protocol once, with one reboot.
func testTwoDrivers(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "twice", 1)
	rec := e.record(t, ctx, f)
	mcds := e.daemons(t, ctx, f, map[string]mcdsim.Options{f.nodes[0]: {Reboot: time.Second}})
	type result struct {
		rep *Report
		err error
	}
	second := make(chan result, 1)
	started := false
	o := e.options(f)
	o.Progress = func(ev Event) {
		if !started && strings.HasPrefix(ev.Msg, "set desiredConfig") {
			started = true
			go func() {
				o2 := e.options(f)
				r, err := e.d.Rollout(ctx, o2)
				second <- result{r, err}
			}()
		}
	}
	r1, err1 := e.d.Rollout(ctx, o)
	r2 := <-second
	conflicts, ok := 0, 0
	for i, err := range []error{err1, r2.err} {
		switch {
		case errors.Is(err, ErrJournalConflict):
			conflicts++
			if rep := []*Report{r1, r2.rep}[i]; rep == nil || rep.State != RolloutStopped {
				t.Errorf("the stopped driver's report: %+v", rep)
			}
		case err == nil:
			ok++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if conflicts != 1 || ok != 1 {
		t.Fatalf("want one driver stopped by a journal conflict and one done: %v / %v", err1, r2.err)
	}
	want := seeds001(f.new)
	if got := rec.wait(f.nodes[0], want[len(want)-1]); !slices.Equal(got, want) {
		t.Errorf("annotation sequence\n got %q\nwant %q", got, want)
	}
	if r := mcds[f.nodes[0]].Reboots(); r != 1 {
		t.Errorf("rebooted %d times, want 1", r)
	}
	if j := e.journal(t, f.pool); j.State != RolloutSucceeded {
		t.Errorf("journal: %s (the stopped driver must not overwrite it)", j.State)
	}
}

func (e *env) lease(t *testing.T, renewed time.Time) {
	t.Helper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: MCCLease, Namespace: MCCNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("mcc-abc_123"), LeaseDurationSeconds: ptr.To(int32(137)),
			RenewTime: &metav1.MicroTime{Time: renewed}}}
	_ = e.cs.CoordinationV1().Leases(MCCNamespace).Delete(context.Background(), MCCLease, metav1.DeleteOptions{})
	if _, err := e.cs.CoordinationV1().Leases(MCCNamespace).Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testMCCAlive(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := e.pool(t, "mcc", 1)
	t.Cleanup(func() {
		_ = e.cs.CoordinationV1().Leases(MCCNamespace).Delete(context.Background(), MCCLease, metav1.DeleteOptions{})
	})
	e.lease(t, time.Now())
	before := e.annotations(t, f)
	rep, err := e.d.Rollout(ctx, e.options(f))
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "mcc-abc_123") || rep.State != "Refused" || !rep.MCC.Alive {
		t.Fatalf("want a refusal naming the MCC's lease holder, got %v", err)
	}
	if after := e.annotations(t, f); after != before {
		t.Errorf("refused rollout changed nodes:\n%s\n%s", before, after)
	}
	e.noJournal(t, f.pool)

	// A lapsed Lease (the MCC cannot reach the API) is no refusal.
	e.lease(t, time.Now().Add(-10*time.Minute))
	m, err := e.d.C.MCCState(ctx, time.Now())
	if err != nil || m.Alive || !strings.Contains(m.Why, "lapsed") {
		t.Fatalf("lapsed lease: %+v %v", m, err)
	}

	// The MCC comes back after the first node: the rollout stops there.
	g := e.pool(t, "mccback", 2)
	_ = e.cs.CoordinationV1().Leases(MCCNamespace).Delete(ctx, MCCLease, metav1.DeleteOptions{})
	e.daemons(t, ctx, g, nil)
	ob := e.options(g)
	ob.Progress = func(ev Event) {
		if ev.Node == g.nodes[0] && ev.Step == StepDone {
			e.lease(t, time.Now())
		}
	}
	rep, err = e.d.Rollout(ctx, ob)
	var back *MCCBackError
	if !errors.As(err, &back) || rep.State != RolloutStopped {
		t.Fatalf("MCC back mid-way: want MCCBackError and state Stopped, got %v", err)
	}
	if j := e.journal(t, g.pool); j.State != RolloutStopped {
		t.Errorf("journal: %s", j.State)
	}
	n1, _ := e.cs.CoreV1().Nodes().Get(ctx, g.nodes[1], metav1.GetOptions{})
	if v := ViewOf(n1); v.Desired != g.old {
		t.Errorf("the second node was started after the MCC came back: %+v", v)
	}

	// --force runs despite a live MCC.
	e.lease(t, time.Now())
	e.daemons(t, ctx, f, nil)
	o := e.options(f)
	o.Force = true
	if rep, err := e.d.Rollout(ctx, o); err != nil || rep.State != RolloutSucceeded {
		t.Fatalf("--force: %v", err)
	}
}

func testBadInput(t *testing.T, e *env) {
	ctx := context.Background()
	f := e.pool(t, "bad", 2)
	other := e.pool(t, "other", 1)
	if _, err := e.dyn.Resource(MachineConfigGVR).Create(ctx, unstructuredMC("00-worker-chrony"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.annotations(t, f)
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		field  string
		value  string
		reason string
	}{
		{"unknown pool", func(o *Options) { o.Pool = "nosuch" }, "--pool", "nosuch", "no such MachineConfigPool"},
		{"config of another pool", func(o *Options) { o.Config = other.new }, "--config", other.new, "not a rendered MachineConfig of pool bad"},
		{"config not rendered", func(o *Options) { o.Config = "00-worker-chrony" }, "--config", "00-worker-chrony", "not a rendered MachineConfig"},
		{"config missing", func(o *Options) { o.Config = "rendered-bad-nosuch" }, "--config", "rendered-bad-nosuch", "not a rendered MachineConfig"},
		{"selector matching no node of the pool", func(o *Options) { o.Selector = roleLabel("other") }, "--selector", roleLabel("other"), "matches no node of pool bad"},
		{"bad selector", func(o *Options) { o.Selector = "a in (" }, "--selector", "a in (", ""},
		{"node not in the pool", func(o *Options) { o.Nodes = []string{other.nodes[0]} }, "--nodes", other.nodes[0], "not a node of pool bad"},
		{"max-unavailable 0", func(o *Options) { o.MaxUnavailable = "0" }, "--max-unavailable", "0", "must be at least 1"},
		{"max-unavailable 0%", func(o *Options) { o.MaxUnavailable = "0%" }, "--max-unavailable", "0%", "more than 0%"},
		{"drain timeout 0", func(o *Options) { o.Timeouts.Drain = 0 }, "--drain-timeout", "0s", "positive"},
	} {
		o := e.options(f)
		tc.mutate(&o)
		_, err := e.d.Rollout(ctx, o)
		var ie *InputError
		if !errors.As(err, &ie) || ie.Field != tc.field || ie.Value != tc.value || !strings.Contains(ie.Reason, tc.reason) {
			t.Errorf("%s: got %v, want field %s value %q reason ~%q", tc.name, err, tc.field, tc.value, tc.reason)
		}
	}
	if after := e.annotations(t, f); after != before {
		t.Errorf("bad input changed nodes:\n%s\n%s", before, after)
	}
	e.noJournal(t, f.pool)
}

func unstructuredMC(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"machineconfiguration.openshift.io/role": "bad"}},
	}}
}

func testDryRun(t *testing.T, e *env) {
	ctx := context.Background()
	f := e.pool(t, "dry", 3)
	before := e.annotations(t, f)
	o := e.options(f)
	o.DryRun = true
	o.MaxUnavailable = "2"
	rep, err := e.d.Rollout(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var next []Action
	for _, n := range rep.Nodes {
		next = append(next, n.Next)
	}
	if want := []Action{ActSetDesired, ActSetDesired, ActWait}; !slices.Equal(next, want) || rep.State != "DryRun" {
		t.Errorf("dry run plan: %v, want %v (state %s)", next, want, rep.State)
	}
	if after := e.annotations(t, f); after != before {
		t.Errorf("dry run changed nodes:\n%s\n%s", before, after)
	}
	e.noJournal(t, f.pool)
}
