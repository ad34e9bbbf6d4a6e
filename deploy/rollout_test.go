package deploy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// rollout is what decides whether the coordinator's rolling update and a
// drain of its nodes complete: the Deployment's arithmetic, the PDB, and
// which replicas the binary reports Ready.
type rollout struct {
	replicas, maxSurge, maxUnavailable int
	pdbMinAvailable                    int // -1: no PDB
	standbyReady                       bool
}

func rolloutOf(d *appsv1.Deployment, pdb *policyv1.PodDisruptionBudget, standbyReady bool) (rollout, error) {
	r := rollout{replicas: 1, pdbMinAvailable: -1, standbyReady: standbyReady}
	if d.Spec.Replicas != nil {
		r.replicas = int(*d.Spec.Replicas)
	}
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil {
		return r, fmt.Errorf("coordinator: strategy %q, want RollingUpdate with explicit maxSurge/maxUnavailable", d.Spec.Strategy.Type)
	}
	var err error
	// Rounding as the Deployment controller does: surge up, unavailable down.
	if r.maxSurge, err = intstr.GetScaledValueFromIntOrPercent(ru.MaxSurge, r.replicas, true); err != nil {
		return r, err
	}
	if r.maxUnavailable, err = intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, r.replicas, false); err != nil {
		return r, err
	}
	if pdb != nil && pdb.Spec.MinAvailable != nil {
		if r.pdbMinAvailable, err = intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, r.replicas, true); err != nil {
			return r, err
		}
	}
	return r, nil
}

type pod struct {
	fresh, leader bool
}

func (r rollout) ready(p pod) bool { return p.leader || r.standbyReady }

// check plays a rolling update the way the Deployment controller does
// (pkg/controller/deployment/rolling.go: scale the new ReplicaSet up to
// replicas+maxSurge, scale old pods down while at least
// replicas-maxUnavailable are available, unhealthy old pods first), with
// one leader among the pods and new pods Ready at once if the binary makes
// them so; then a drain of the leader's node against the PDB.
func (r rollout) check() error {
	var errs []error
	if r.replicas < 2 {
		errs = append(errs, fmt.Errorf("replicas %d: want 2 (a leader and a standby)", r.replicas))
	}
	if r.maxSurge != 0 {
		errs = append(errs, fmt.Errorf("maxSurge %d: host-network replicas hold host ports and never share a node: a surge pod may find no node", r.maxSurge))
	}
	switch {
	case r.pdbMinAvailable < 0:
		errs = append(errs, errors.New("no PodDisruptionBudget: a drain may evict both replicas at once"))
	case r.pdbMinAvailable >= r.replicas:
		errs = append(errs, fmt.Errorf("PDB minAvailable %d of %d replicas: no eviction is ever allowed, drains block", r.pdbMinAvailable, r.replicas))
	}
	pods := []pod{{leader: true}}
	for len(pods) < r.replicas {
		pods = append(pods, pod{})
	}
	count := func(f func(pod) bool) (n int) {
		for _, p := range pods {
			if f(p) {
				n++
			}
		}
		return n
	}
	done := false
	for step := 0; step < 20 && !done; step++ {
		changed := false
		// Scale up the new ReplicaSet.
		for len(pods) < r.replicas+r.maxSurge && count(func(p pod) bool { return p.fresh }) < r.replicas {
			pods, changed = append(pods, pod{fresh: true}), true
		}
		// Scale down old pods, unhealthy (unready) ones first.
		minAvail := r.replicas - r.maxUnavailable
		newUnavailable := count(func(p pod) bool { return p.fresh && !r.ready(p) })
		budget := len(pods) - minAvail - newUnavailable
		for budget > 0 {
			i := -1
			for j, p := range pods {
				if !p.fresh && (i < 0 || (r.ready(pods[i]) && !r.ready(p))) {
					i = j
				}
			}
			if i < 0 {
				break
			}
			// A ready old pod goes only if enough stay available.
			if r.ready(pods[i]) && count(r.ready)-1 < minAvail {
				break
			}
			wasLeader := pods[i].leader
			pods = append(pods[:i], pods[i+1:]...)
			if wasLeader && len(pods) > 0 {
				pods[0].leader = true // the other replica takes the Lease
			}
			budget, changed = budget-1, true
		}
		done = count(func(p pod) bool { return p.fresh && r.ready(p) }) == r.replicas && len(pods) == r.replicas
		if !changed && !done {
			errs = append(errs, fmt.Errorf("rolling update stuck after %d steps: %d old, %d new, %d ready; maxSurge %d, maxUnavailable %d (a standby that is not Ready is replaced by another that is not, and the leader can never go)",
				step, count(func(p pod) bool { return !p.fresh }), count(func(p pod) bool { return p.fresh }), count(r.ready), r.maxSurge, r.maxUnavailable))
			break
		}
	}
	// Drain the leader's node: the eviction API allows it while the PDB
	// keeps minAvailable healthy pods after it.
	if r.pdbMinAvailable >= 0 && r.replicas >= 2 {
		healthy := r.replicas // after the rollout, every pod is Ready if the standby is
		if !r.standbyReady {
			healthy = 1
		}
		if healthy-1 < r.pdbMinAvailable {
			errs = append(errs, fmt.Errorf("drain of the leader's node blocked: %d healthy replicas, PDB minAvailable %d", healthy, r.pdbMinAvailable))
		}
	}
	return errors.Join(errs...)
}

// The shipped Deployment and PDB, with the binary's readiness
// (every replica Ready: the standby forwards, TestClusterHandOver),
// complete a rolling update and let the leader's node drain.
func TestRolloutArithmetic(t *testing.T) {
	for _, k := range kustomizations {
		t.Run(strings.ReplaceAll(k, "/", "_"), func(t *testing.T) {
			objs := render(t, k)
			var d appsv1.Deployment
			var pdb policyv1.PodDisruptionBudget
			find(t, objs, "Deployment", "cutover-coordinator", &d)
			find(t, objs, "PodDisruptionBudget", "cutover-coordinator", &pdb)
			switch {
			case k == "overlays/openshift":
				// OpenShift 3.11 (Kubernetes 1.11) serves policy/v1beta1 only,
				// without unhealthyPodEvictionPolicy (docs/openshift-sdn.md).
				if pdb.APIVersion != "policy/v1beta1" || pdb.Spec.UnhealthyPodEvictionPolicy != nil {
					t.Errorf("PDB: %s with unhealthyPodEvictionPolicy %v, want policy/v1beta1 without it (what 3.11 serves)", pdb.APIVersion, pdb.Spec.UnhealthyPodEvictionPolicy)
				}
			case pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow:
				t.Error("PDB: unhealthyPodEvictionPolicy must be AlwaysAllow: an unready replica must never block a drain")
			}
			for key, v := range pdb.Spec.Selector.MatchLabels {
				if d.Spec.Template.Labels[key] != v {
					t.Errorf("PDB selects %s=%s, the coordinator pods do not carry it", key, v)
				}
			}
			r, err := rolloutOf(&d, &pdb, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// The check fails on what shipped first (only the leader Ready, no PDB) and on the obvious
// wrong fixes.
func TestRolloutArithmeticFailsOnBadSettings(t *testing.T) {
	for _, c := range []struct {
		name string
		r    rollout
		want []string
	}{
		{"as first shipped: only the leader Ready, no PDB", rollout{replicas: 2, maxUnavailable: 1, pdbMinAvailable: -1}, []string{"rolling update stuck", "no PodDisruptionBudget"}},
		{"a PDB with only the leader Ready", rollout{replicas: 2, maxUnavailable: 1, pdbMinAvailable: 1}, []string{"rolling update stuck", "drain of the leader's node blocked"}},
		{"minAvailable = replicas", rollout{replicas: 2, maxUnavailable: 1, pdbMinAvailable: 2, standbyReady: true}, []string{"no eviction is ever allowed"}},
		{"surge", rollout{replicas: 2, maxSurge: 1, maxUnavailable: 0, pdbMinAvailable: 1, standbyReady: true}, []string{"maxSurge 1"}},
		{"nothing may go", rollout{replicas: 2, maxUnavailable: 0, pdbMinAvailable: 1, standbyReady: true}, []string{"rolling update stuck"}},
	} {
		err := c.r.check()
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: check did not say %q: %v", c.name, w, err)
			}
		}
	}
	if err := (rollout{replicas: 2, maxUnavailable: 1, pdbMinAvailable: 1, standbyReady: true}).check(); err != nil {
		t.Errorf("the fixed settings: %v", err)
	}
}
