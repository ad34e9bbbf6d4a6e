package openshift

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// Strategies.
const (
	StrategySourceOfTruthFirst = "source-of-truth-first"
	StrategyFieldReport        = "field-report"
)

// TriggersAnnotation is the image-change trigger annotation the field
// report removes from the SDN DaemonSet and puts back from its saved copy.
const TriggersAnnotation = "image.openshift.io/triggers"

// Config configures the coordinator side of the openshift-sdn profile.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	Strategy string
	// Image is the SDN image without the health check
	// (StrategyFieldReport), e.g. registry.example/ose-node:v3.11-custom.
	Image string

	Namespace      string // the SDN's namespace, "openshift-sdn"
	DaemonSet      string // "sdn"
	Container      string // the DaemonSet's container whose image is swapped, "sdn"
	PodSelector    string // the SDN pods, "app=sdn"
	ClusterNetwork string // "default"
	// SaveConfigMap holds the DaemonSet's image and trigger annotation
	// while StrategyFieldReport runs (in Namespace), the field report's
	// sdn_saved.yml.
	SaveConfigMap string

	// HealthInterval is the SDN's health-check interval: the plan says
	// how much of it the change may use.
	HealthInterval time.Duration
	// PodTimeout bounds the wait for one restarted SDN pod to be Ready;
	// RolloutTimeout the wait for a DaemonSet rollout.
	PodTimeout, RolloutTimeout time.Duration
	Poll                       time.Duration

	// Out receives what the admin must read: the plan, the master-config
	// change, timings. nil: discard.
	Out io.Writer
	Now func() time.Time
}

// Default fills unset fields.
func (c Config) Default() Config {
	set := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	set(&c.Strategy, StrategySourceOfTruthFirst)
	set(&c.Namespace, "openshift-sdn")
	set(&c.DaemonSet, "sdn")
	set(&c.Container, "sdn")
	set(&c.PodSelector, "app=sdn")
	set(&c.ClusterNetwork, "default")
	set(&c.SaveConfigMap, "cutover-sdn-saved")
	if c.HealthInterval <= 0 {
		c.HealthInterval = 30 * time.Second
	}
	if c.PodTimeout <= 0 {
		c.PodTimeout = 2 * time.Minute
	}
	if c.RolloutTimeout <= 0 {
		c.RolloutTimeout = 10 * time.Minute
	}
	if c.Poll <= 0 {
		c.Poll = 100 * time.Millisecond
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch c.Strategy {
	case StrategySourceOfTruthFirst:
		if c.Image != "" {
			return fmt.Errorf("openshift image %q: only the %s strategy swaps the SDN image", c.Image, StrategyFieldReport)
		}
	case StrategyFieldReport:
		if c.Image == "" {
			return fmt.Errorf("openshift image: required by the %s strategy (the SDN image without the health check, pre-pulled on every node)", StrategyFieldReport)
		}
	default:
		return fmt.Errorf("openshift strategy %q: want %s or %s", c.Strategy, StrategySourceOfTruthFirst, StrategyFieldReport)
	}
	if c.Client == nil || c.Dynamic == nil {
		return fmt.Errorf("openshift: Kubernetes clients are required")
	}
	return nil
}

// Hook is the openshift-sdn profile as a coordinator.Hook.
type Hook struct {
	cfg Config
	cn  *ClusterNetwork
	// Timings of the last operation, for the report and the tests.
	Timings Timings
}

// Timings are what the hook measured in one operation.
type Timings struct {
	BeforeCommitStart, BeforeCommitEnd time.Time
	AfterConfirmStart, AfterConfirmEnd time.Time
	PodRestarts                        []time.Duration // one per SDN pod, in order
}

var _ coordinator.Hook = (*Hook)(nil)

// New returns the hook for cfg (defaults applied).
func New(cfg Config) (*Hook, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Hook{cfg: cfg, cn: &ClusterNetwork{Client: cfg.Dynamic, Name: cfg.ClusterNetwork}}, nil
}

// Name implements coordinator.Hook.
func (h *Hook) Name() string { return "openshift-sdn/" + h.cfg.Strategy }

func (h *Hook) say(format string, args ...any) {
	_, _ = fmt.Fprintf(h.cfg.Out, "openshift-sdn: "+format+"\n", args...)
}

// Plan reads the ClusterNetwork, the SDN DaemonSet and its pods, and says
// what the cutover will touch (lines) and what stops it (problems). It
// changes nothing.
func (h *Hook) Plan(ctx context.Context, op coordinator.OpInfo) (lines, problems []string) {
	c := h.cfg
	if p := h.cnoProblem(ctx); p != "" {
		problems = append(problems, p)
	}
	desc, err := h.cn.Describe(ctx)
	if err != nil {
		problems = append(problems, fmt.Sprintf("%v (openshift-sdn reads the VXLAN port there; is this an openshift-sdn cluster?)", err))
	} else {
		lines = append(lines, desc)
		if p, err := h.cn.Port(ctx); err == nil && p != op.FromPort {
			problems = append(problems, fmt.Sprintf("%s but the nodes are on %d: an SDN restart would rebuild every node onto %d; make them agree first", desc, op.FromPort, p))
		}
	}
	ds, err := c.Client.AppsV1().DaemonSets(c.Namespace).Get(ctx, c.DaemonSet, metav1.GetOptions{})
	if err != nil {
		problems = append(problems, fmt.Sprintf("SDN DaemonSet %s/%s: %v", c.Namespace, c.DaemonSet, err))
	} else {
		img, _ := containerImage(ds, c.Container)
		lines = append(lines, fmt.Sprintf("SDN DaemonSet %s/%s: image %s, %d/%d pods ready, %d updated; %s annotation %s",
			c.Namespace, c.DaemonSet, img, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, ds.Status.UpdatedNumberScheduled,
			TriggersAnnotation, presence(ds.Annotations, TriggersAnnotation)))
		if _, ok := containerImage(ds, c.Container); !ok {
			problems = append(problems, fmt.Sprintf("SDN DaemonSet %s/%s has no container %q", c.Namespace, c.DaemonSet, c.Container))
		}
		if !rolloutDone(ds) {
			problems = append(problems, fmt.Sprintf("SDN DaemonSet %s/%s is not settled (%d/%d ready, %d updated): wait for it", c.Namespace, c.DaemonSet,
				ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, ds.Status.UpdatedNumberScheduled))
		}
		if c.Strategy == StrategyFieldReport && img == c.Image {
			problems = append(problems, fmt.Sprintf("SDN DaemonSet already runs %s: a previous run did not restore it; restore the image from ConfigMap %s/%s first", c.Image, c.Namespace, c.SaveConfigMap))
		}
	}
	if c.Strategy == StrategyFieldReport {
		if _, err := c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.SaveConfigMap, metav1.GetOptions{}); err == nil {
			problems = append(problems, fmt.Sprintf("ConfigMap %s/%s exists: the saved DaemonSet of an earlier run that did not finish; restore from it (or delete it) first", c.Namespace, c.SaveConfigMap))
		}
	}
	pods, err := h.pods(ctx)
	if err != nil {
		problems = append(problems, err.Error())
	}
	switch c.Strategy {
	case StrategySourceOfTruthFirst:
		lines = append(lines,
			fmt.Sprintf("before commit: delete and recreate ClusterNetwork %s with vxlanPort %d (every other field kept)", c.ClusterNetwork, op.ToPort),
			fmt.Sprintf("the admin must then set networkConfig.vxlanPort: %d in /etc/origin/master/master-config.yaml on every master", op.ToPort),
			fmt.Sprintf("after confirm: restart the %d SDN pods one at a time (delete, wait Ready): each finds vxlan0 on %d already and does not rebuild br0", len(pods), op.ToPort))
	case StrategyFieldReport:
		lines = append(lines,
			fmt.Sprintf("before commit: save the DaemonSet's image and %s to ConfigMap %s/%s, set image %s (no health check), remove the annotation, wait for the rollout", TriggersAnnotation, c.Namespace, c.SaveConfigMap, c.Image),
			fmt.Sprintf("after confirm: recreate ClusterNetwork %s with vxlanPort %d, then restore the image and annotation from the saved copy and wait for the rollout", c.ClusterNetwork, op.ToPort),
			fmt.Sprintf("the admin must set networkConfig.vxlanPort: %d in /etc/origin/master/master-config.yaml on every master", op.ToPort))
	}
	lines = append(lines,
		fmt.Sprintf("budget: the SDN health check runs every %s; from commit to the last SDN restart must stay well inside it", c.HealthInterval),
		"WARNING egress IP: openshift-sdn's VXLAN monitor marks an egress node offline after about 7 s of unanswered VXLAN traffic and moves its egress IPs; the commit window is milliseconds, but a failed node left on the old port trips it")
	return lines, problems
}

// NextSteps implements coordinator.NextStepper: the masters' configuration
// is a file on each master, out of the API's reach, and a master restarted
// with the old vxlanPort recreates the ClusterNetwork on it; the next SDN
// restart would then rebuild every node's br0 onto the old port.
func (h *Hook) NextSteps(op coordinator.OpInfo) []string {
	return []string{fmt.Sprintf("set networkConfig.vxlanPort: %d in /etc/origin/master/master-config.yaml on every master, then restart the masters one at a time (master-restart api; master-restart controllers): a master restarted with %d recreates ClusterNetwork %s on it, and the next SDN restart rebuilds br0 there",
		op.ToPort, op.FromPort, h.cfg.ClusterNetwork)}
}

var _ coordinator.NextStepper = (*Hook)(nil)
var _ coordinator.Planner = (*Hook)(nil)

func presence(m map[string]string, k string) string {
	if _, ok := m[k]; ok {
		return "present"
	}
	return "absent"
}

// Preflight implements coordinator.Hook: the plan goes to Out, the
// problems to the caller.
func (h *Hook) Preflight(ctx context.Context, op coordinator.OpInfo) []string {
	lines, problems := h.Plan(ctx, op)
	for _, l := range lines {
		h.say("%s", l)
	}
	return problems
}

// BeforeCommit implements coordinator.Hook.
func (h *Hook) BeforeCommit(ctx context.Context, op coordinator.OpInfo) error {
	h.Timings = Timings{BeforeCommitStart: h.cfg.Now()}
	defer func() { h.Timings.BeforeCommitEnd = h.cfg.Now() }()
	if p := h.cnoProblem(ctx); p != "" { // installed since the preflight: before the source of truth is touched
		return fmt.Errorf("%s", p)
	}
	switch h.cfg.Strategy {
	case StrategySourceOfTruthFirst:
		return h.moveSourceOfTruth(ctx, op.ToPort)
	default:
		if err := h.saveDaemonSet(ctx, op); err != nil {
			return err
		}
		if err := h.setImage(ctx, h.cfg.Image, nil); err != nil {
			return err
		}
		return h.waitRollout(ctx)
	}
}

// AfterConfirm implements coordinator.Hook.
func (h *Hook) AfterConfirm(ctx context.Context, op coordinator.OpInfo) error {
	h.Timings.AfterConfirmStart = h.cfg.Now()
	defer func() { h.Timings.AfterConfirmEnd = h.cfg.Now() }()
	switch h.cfg.Strategy {
	case StrategySourceOfTruthFirst:
		return h.restartPods(ctx)
	default:
		if err := h.moveSourceOfTruth(ctx, op.ToPort); err != nil {
			return err
		}
		if err := h.restoreDaemonSet(ctx); err != nil {
			return err
		}
		return h.waitRollout(ctx)
	}
}

// Finalize implements coordinator.Hook: check the source of truth says the
// new port, drop the saved copy.
func (h *Hook) Finalize(ctx context.Context, op coordinator.OpInfo) error {
	p, err := h.cn.Port(ctx)
	if err != nil {
		return err
	}
	if p != op.ToPort {
		return fmt.Errorf("ClusterNetwork %s says vxlanPort %d after the cutover to %d: an SDN restart would rebuild every node onto %d", h.cfg.ClusterNetwork, p, op.ToPort, p)
	}
	if h.cfg.Strategy == StrategyFieldReport {
		err := h.cfg.Client.CoreV1().ConfigMaps(h.cfg.Namespace).Delete(ctx, h.cfg.SaveConfigMap, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the saved copy ConfigMap %s/%s: %w", h.cfg.Namespace, h.cfg.SaveConfigMap, err)
		}
	}
	return nil
}

// Restore implements coordinator.Hook: put the ClusterNetwork (and, for
// the field report's strategy, the DaemonSet) back as before.
func (h *Hook) Restore(ctx context.Context, op coordinator.OpInfo) error {
	var errs []string
	if p, err := h.cn.Port(ctx); err != nil || p != op.FromPort {
		if err := h.cn.Recreate(ctx, op.FromPort); err != nil {
			errs = append(errs, err.Error())
		} else {
			h.say("ClusterNetwork %s recreated with vxlanPort %d again; master-config networkConfig.vxlanPort must say %d", h.cfg.ClusterNetwork, op.FromPort, op.FromPort)
		}
	}
	if h.cfg.Strategy == StrategyFieldReport {
		if err := h.restoreDaemonSet(ctx); err != nil {
			errs = append(errs, err.Error())
		} else if err := h.waitRollout(ctx); err != nil {
			errs = append(errs, err.Error())
		} else {
			_ = h.cfg.Client.CoreV1().ConfigMaps(h.cfg.Namespace).Delete(ctx, h.cfg.SaveConfigMap, metav1.DeleteOptions{})
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("openshift-sdn restore: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (h *Hook) moveSourceOfTruth(ctx context.Context, port tunnelport.Port) error {
	if err := h.cn.Recreate(ctx, port); err != nil {
		return err
	}
	h.say("ClusterNetwork %s recreated with vxlanPort %d", h.cfg.ClusterNetwork, port)
	h.say("ACTION REQUIRED: set networkConfig.vxlanPort: %d in /etc/origin/master/master-config.yaml on every master, then restart the masters one at a time (master-restart api; master-restart controllers), or a master restart recreates the old ClusterNetwork", port)
	return nil
}

func (h *Hook) pods(ctx context.Context) ([]corev1.Pod, error) {
	c := h.cfg
	l, err := c.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: c.PodSelector})
	if err != nil {
		return nil, fmt.Errorf("SDN pods in %s (%s): %w", c.Namespace, c.PodSelector, err)
	}
	items := l.Items
	slices.SortFunc(items, func(a, b corev1.Pod) int { return strings.Compare(a.Spec.NodeName, b.Spec.NodeName) })
	return items, nil
}

// restartPods deletes each SDN pod and waits for its replacement on the
// same node to be Ready before the next, as `oc delete pod` one by one.
func (h *Hook) restartPods(ctx context.Context) error {
	pods, err := h.pods(ctx)
	if err != nil {
		return err
	}
	for _, p := range pods {
		start := h.cfg.Now()
		uid := p.UID
		if err := h.cfg.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("restart SDN pod %s (node %s): %w", p.Name, p.Spec.NodeName, err)
		}
		if err := h.waitPod(ctx, p.Spec.NodeName, uid); err != nil {
			return err
		}
		d := h.cfg.Now().Sub(start)
		h.Timings.PodRestarts = append(h.Timings.PodRestarts, d)
		h.say("SDN pod on %s restarted and Ready in %s", p.Spec.NodeName, d.Round(time.Millisecond))
	}
	return nil
}

// waitPod waits for a Ready SDN pod on node other than old.
func (h *Hook) waitPod(ctx context.Context, node string, old types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.PodTimeout)
	defer cancel()
	for {
		pods, err := h.pods(ctx)
		if err == nil {
			for _, p := range pods {
				if p.Spec.NodeName == node && p.UID != old && p.DeletionTimestamp == nil && podReady(&p) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("SDN pod on node %s not Ready again within %s: %w", node, h.cfg.PodTimeout, ctx.Err())
		case <-time.After(h.cfg.Poll):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerImage(ds *appsv1.DaemonSet, name string) (string, bool) {
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c.Image, true
		}
	}
	return "", false
}

func rolloutDone(ds *appsv1.DaemonSet) bool {
	st := ds.Status
	return st.ObservedGeneration >= ds.Generation && st.DesiredNumberScheduled > 0 &&
		st.UpdatedNumberScheduled == st.DesiredNumberScheduled && st.NumberReady == st.DesiredNumberScheduled
}

// saved is what StrategyFieldReport keeps of the DaemonSet.
type saved struct {
	Op          string  `json:"op"`
	Image       string  `json:"image"`
	Triggers    *string `json:"triggers,omitempty"` // nil: there was none
	DaemonSetRV string  `json:"daemonset_resource_version"`
}

func (h *Hook) saveDaemonSet(ctx context.Context, op coordinator.OpInfo) error {
	c := h.cfg
	cms := c.Client.CoreV1().ConfigMaps(c.Namespace)
	if cm, err := cms.Get(ctx, c.SaveConfigMap, metav1.GetOptions{}); err == nil {
		var s saved
		if json.Unmarshal([]byte(cm.Data["saved.json"]), &s) == nil && s.Op == op.ID {
			return nil // a replay of this operation: the copy is the original
		}
		return fmt.Errorf("ConfigMap %s/%s holds a saved DaemonSet of operation %q: restore from it first", c.Namespace, c.SaveConfigMap, s.Op)
	}
	ds, err := c.Client.AppsV1().DaemonSets(c.Namespace).Get(ctx, c.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("SDN DaemonSet %s/%s: %w", c.Namespace, c.DaemonSet, err)
	}
	img, ok := containerImage(ds, c.Container)
	if !ok {
		return fmt.Errorf("SDN DaemonSet %s/%s has no container %q", c.Namespace, c.DaemonSet, c.Container)
	}
	s := saved{Op: op.ID, Image: img, DaemonSetRV: ds.ResourceVersion}
	if t, ok := ds.Annotations[TriggersAnnotation]; ok {
		s.Triggers = &t
	}
	b, _ := json.Marshal(s)
	full, _ := json.Marshal(ds)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: c.SaveConfigMap, Namespace: c.Namespace,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "cutover"}},
		Data: map[string]string{"saved.json": string(b), "daemonset.json": string(full)}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("save the SDN DaemonSet to ConfigMap %s/%s: %w", c.Namespace, c.SaveConfigMap, err)
	}
	h.say("saved DaemonSet %s/%s image %s and %s to ConfigMap %s", c.Namespace, c.DaemonSet, img, TriggersAnnotation, c.SaveConfigMap)
	return nil
}

func (h *Hook) restoreDaemonSet(ctx context.Context) error {
	c := h.cfg
	cm, err := c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.SaveConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil // nothing was changed (BeforeCommit did not get that far)
	}
	if err != nil {
		return fmt.Errorf("read the saved copy ConfigMap %s/%s: %w", c.Namespace, c.SaveConfigMap, err)
	}
	var s saved
	if err := json.Unmarshal([]byte(cm.Data["saved.json"]), &s); err != nil {
		return fmt.Errorf("ConfigMap %s/%s saved.json: %w", c.Namespace, c.SaveConfigMap, err)
	}
	if err := h.setImage(ctx, s.Image, s.Triggers); err != nil {
		return err
	}
	h.say("restored DaemonSet %s/%s image %s and %s from ConfigMap %s", c.Namespace, c.DaemonSet, s.Image, TriggersAnnotation, c.SaveConfigMap)
	return nil
}

// setImage sets the container's image and the triggers annotation
// (removed when triggers is nil).
func (h *Hook) setImage(ctx context.Context, image string, triggers *string) error {
	c := h.cfg
	dss := c.Client.AppsV1().DaemonSets(c.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dss.Get(ctx, c.DaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range ds.Spec.Template.Spec.Containers {
			if ds.Spec.Template.Spec.Containers[i].Name == c.Container {
				ds.Spec.Template.Spec.Containers[i].Image = image
			}
		}
		if ds.Annotations == nil {
			ds.Annotations = map[string]string{}
		}
		if triggers == nil {
			delete(ds.Annotations, TriggersAnnotation)
		} else {
			ds.Annotations[TriggersAnnotation] = *triggers
		}
		_, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("set SDN DaemonSet %s/%s image %s: %w", c.Namespace, c.DaemonSet, image, err)
	}
	return nil
}

func (h *Hook) waitRollout(ctx context.Context) error {
	c := h.cfg
	ctx, cancel := context.WithTimeout(ctx, c.RolloutTimeout)
	defer cancel()
	start := c.Now()
	for {
		ds, err := c.Client.AppsV1().DaemonSets(c.Namespace).Get(ctx, c.DaemonSet, metav1.GetOptions{})
		if err == nil && rolloutDone(ds) {
			h.say("SDN DaemonSet rollout done in %s", c.Now().Sub(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("SDN DaemonSet %s/%s rollout not done within %s: %w", c.Namespace, c.DaemonSet, c.RolloutTimeout, ctx.Err())
		case <-time.After(c.Poll):
		}
	}
}
