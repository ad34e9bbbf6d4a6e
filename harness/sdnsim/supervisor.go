package sdnsim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// SDN DaemonSet coordinates, as on OpenShift 3.11 / 4.x with openshift-sdn.
const (
	Namespace     = "openshift-sdn"
	DaemonSetName = "sdn"
	PodLabel      = "app"
	PodLabelValue = "sdn"
	ContainerName = "sdn"
)

// SupervisorConfig configures a Supervisor.
type SupervisorConfig struct {
	Client kubernetes.Interface
	Nodes  []string
	// Command is the stand-in's command line for node running image (the
	// image decides the behaviour, e.g. a patched one without health
	// check). The supervisor adds nothing to it.
	Command func(node, image string) *exec.Cmd
	LogDir  string        // <LogDir>/sdn-<node>.log gets each process's stderr
	Poll    time.Duration // default 100 ms
}

// Event is something a stand-in or the supervisor did.
type Event struct {
	Time time.Time
	Node string
	PID  int
	What string // e.g. "start port=4789 setup=rebuilt healthcheck=true", "exit code=2", "pod deleted"
}

func (e Event) String() string {
	return fmt.Sprintf("%s %s pid %d: %s", e.Time.Format("15:04:05.000"), e.Node, e.PID, e.What)
}

type proc struct {
	cmd   *exec.Cmd
	ready bool
	done  chan struct{}
}

// Supervisor plays kubelet and DaemonSet controller for the stand-ins of
// the openshift-sdn/sdn DaemonSet: it keeps one Pod object and one process
// per node, restarts a process that exits (restartCount), stops it and
// starts a new one when its Pod is deleted (the Pod is recreated with a new
// UID), replaces Pods one at a time when the DaemonSet's image changes, and
// writes Pod readiness and DaemonSet rollout status back to the API.
type Supervisor struct {
	cfg    SupervisorConfig
	mu     sync.Mutex
	procs  map[string]*proc
	events []Event
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// NewSupervisor returns a supervisor; Start runs it.
func NewSupervisor(cfg SupervisorConfig) (*Supervisor, error) {
	if cfg.Client == nil || cfg.Command == nil || len(cfg.Nodes) == 0 {
		return nil, errors.New("sdnsim supervisor: Client, Command and Nodes are required")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	return &Supervisor{cfg: cfg, procs: map[string]*proc{}}, nil
}

func (s *Supervisor) record(node string, pid int, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, Event{Time: time.Now(), Node: node, PID: pid, What: what})
}

// Events returns what happened so far, in order.
func (s *Supervisor) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// EventsSince returns the events at or after t.
func (s *Supervisor) EventsSince(t time.Time) []Event {
	var out []Event
	for _, e := range s.Events() {
		if !e.Time.Before(t) {
			out = append(out, e)
		}
	}
	return out
}

// Start runs the supervisor until ctx ends or Stop.
func (s *Supervisor) Start(ctx context.Context) {
	ctx, s.stop = context.WithCancel(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(s.cfg.Poll)
		defer t.Stop()
		for {
			if err := s.tick(ctx); err != nil && ctx.Err() == nil {
				s.record("-", 0, "supervisor: "+err.Error())
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Stop stops the loop and every stand-in (SIGTERM, then SIGKILL), by PID.
func (s *Supervisor) Stop() {
	if s.stop != nil {
		s.stop()
	}
	s.wg.Wait()
	s.mu.Lock()
	procs := s.procs
	s.procs = map[string]*proc{}
	s.mu.Unlock()
	for _, p := range procs {
		stopProc(p)
	}
}

func stopProc(p *proc) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// WaitReady waits until every node's Pod runs the DaemonSet's image and is
// Ready.
func (s *Supervisor) WaitReady(ctx context.Context) error {
	for {
		ds, err := s.cfg.Client.AppsV1().DaemonSets(Namespace).Get(ctx, DaemonSetName, metav1.GetOptions{})
		if err == nil && RolloutDone(ds) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("sdn pods not ready: %w (last: %w)", ctx.Err(), err)
			}
			return fmt.Errorf("sdn pods not ready: %w", ctx.Err())
		case <-time.After(s.cfg.Poll):
		}
	}
}

// RolloutDone reports whether a DaemonSet's status says every pod is
// updated and ready for its current generation.
func RolloutDone(ds *appsv1.DaemonSet) bool {
	st := ds.Status
	return st.ObservedGeneration >= ds.Generation && st.DesiredNumberScheduled > 0 &&
		st.UpdatedNumberScheduled == st.DesiredNumberScheduled && st.NumberReady == st.DesiredNumberScheduled &&
		st.NumberAvailable == st.DesiredNumberScheduled
}

func imageOf(spec corev1.PodSpec) string {
	for _, c := range spec.Containers {
		if c.Name == ContainerName {
			return c.Image
		}
	}
	if len(spec.Containers) > 0 {
		return spec.Containers[0].Image
	}
	return ""
}

func (s *Supervisor) tick(ctx context.Context) error {
	cs := s.cfg.Client
	ds, err := cs.AppsV1().DaemonSets(Namespace).Get(ctx, DaemonSetName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("daemonset %s/%s: %w", Namespace, DaemonSetName, err)
	}
	image := imageOf(ds.Spec.Template.Spec)
	list, err := cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: PodLabel + "=" + PodLabelValue})
	if err != nil {
		return err
	}
	byNode := map[string]*corev1.Pod{}
	for i := range list.Items {
		byNode[list.Items[i].Spec.NodeName] = &list.Items[i]
	}
	var updated, ready, current int32
	rolling := false
	for _, node := range s.cfg.Nodes {
		pod := byNode[node]
		if pod != nil && pod.DeletionTimestamp != nil {
			// The kubelet's part of a graceful delete: stop the
			// container, then remove the object for good.
			s.kill(node)
			zero := int64(0)
			err := cs.CoreV1().Pods(Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
				Preconditions: &metav1.Preconditions{UID: &pod.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return err
			}
			s.record(node, 0, "pod deleted")
			rolling = true
			continue
		}
		if pod == nil {
			if pod, err = s.createPod(ctx, ds, node, image); err != nil {
				return err
			}
		}
		p := s.ensureProc(node, imageOf(pod.Spec))
		current++
		if err := s.syncStatus(ctx, pod, p); err != nil {
			return err
		}
		if imageOf(pod.Spec) == image {
			updated++
		}
		// p.ready is written by the process's output reader: read it
		// under the lock.
		s.mu.Lock()
		isReady := p.ready
		s.mu.Unlock()
		if isReady {
			ready++
		} else {
			rolling = true
		}
	}
	// Rolling update, maxUnavailable 1: replace one outdated pod when all
	// are ready.
	if !rolling {
		for _, node := range s.cfg.Nodes {
			pod := byNode[node]
			if pod != nil && imageOf(pod.Spec) != image {
				if err := cs.CoreV1().Pods(Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
				s.record(node, 0, "rollout: replacing pod running "+imageOf(pod.Spec))
				break
			}
		}
	}
	st := appsv1.DaemonSetStatus{
		ObservedGeneration:     ds.Generation,
		DesiredNumberScheduled: int32(len(s.cfg.Nodes)),
		CurrentNumberScheduled: current,
		UpdatedNumberScheduled: updated,
		NumberReady:            ready,
		NumberAvailable:        ready,
		NumberUnavailable:      int32(len(s.cfg.Nodes)) - ready,
	}
	if !equality.Semantic.DeepEqual(ds.Status, st) {
		ds.Status = st
		if _, err := cs.AppsV1().DaemonSets(Namespace).UpdateStatus(ctx, ds, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

func (s *Supervisor) createPod(ctx context.Context, ds *appsv1.DaemonSet, node, image string) (*corev1.Pod, error) {
	spec := *ds.Spec.Template.Spec.DeepCopy()
	spec.NodeName = node
	labels := map[string]string{}
	for k, v := range ds.Spec.Template.Labels {
		labels[k] = v
	}
	labels[PodLabel] = PodLabelValue
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sdn-" + node, Namespace: Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID}}},
		Spec: spec,
	}
	out, err := s.cfg.Client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod for node %s: %w", node, err)
	}
	s.record(node, 0, "pod created image="+image)
	return out, nil
}

// ensureProc starts node's stand-in when none runs (first start, after its
// pod was replaced, or after it exited: the kubelet's restart).
func (s *Supervisor) ensureProc(node, image string) *proc {
	s.mu.Lock()
	p := s.procs[node]
	s.mu.Unlock()
	if p != nil {
		select {
		case <-p.done:
		default:
			return p
		}
	}
	np := &proc{cmd: s.cfg.Command(node, image), done: make(chan struct{})}
	if err := s.spawn(node, np); err != nil {
		s.record(node, 0, "start failed: "+err.Error())
		close(np.done)
	}
	s.mu.Lock()
	s.procs[node] = np
	s.mu.Unlock()
	return np
}

func (s *Supervisor) spawn(node string, p *proc) error {
	cmd := p.cmd
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A stand-in must not outlive the test (or lab tool) running it.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var logw io.WriteCloser = nopCloser{io.Discard}
	if s.cfg.LogDir != "" {
		f, err := os.OpenFile(filepath.Join(s.cfg.LogDir, "sdn-"+node+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		logw = f
	}
	cmd.Stderr = logw
	out, err := cmd.StdoutPipe()
	if err != nil {
		_ = logw.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = logw.Close()
		return err
	}
	pid := cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "EVENT ")
			if !ok {
				continue
			}
			if line == "ready" {
				s.mu.Lock()
				p.ready = true
				s.mu.Unlock()
				continue
			}
			s.record(node, pid, line)
		}
		err := cmd.Wait()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		s.mu.Lock()
		p.ready = false
		s.mu.Unlock()
		s.record(node, pid, fmt.Sprintf("exit code=%d", code))
		_ = logw.Close()
		close(p.done)
	}()
	return nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

func (s *Supervisor) kill(node string) {
	s.mu.Lock()
	p := s.procs[node]
	delete(s.procs, node)
	s.mu.Unlock()
	if p != nil {
		stopProc(p)
	}
}

func (s *Supervisor) syncStatus(ctx context.Context, pod *corev1.Pod, p *proc) error {
	s.mu.Lock()
	ready := p.ready
	s.mu.Unlock()
	restarts := int32(0)
	for _, c := range pod.Status.ContainerStatuses {
		restarts = c.RestartCount
	}
	// A process started for this pod after an earlier one exited counts
	// as a restart of the container.
	s.mu.Lock()
	cur := s.procs[pod.Spec.NodeName]
	s.mu.Unlock()
	pid := int32(0)
	if cur != nil && cur.cmd.Process != nil {
		pid = int32(cur.cmd.Process.Pid)
	}
	lastPID := int32(0)
	if v, ok := pod.Annotations["sdnsim/pid"]; ok {
		_, _ = fmt.Sscan(v, &lastPID)
	}
	if lastPID != 0 && pid != 0 && lastPID != pid {
		restarts++
	}
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	if pod.Status.Phase == corev1.PodRunning && PodReady(pod) == ready && lastPID == pid {
		return nil
	}
	if lastPID != pid {
		po := pod.DeepCopy()
		if po.Annotations == nil {
			po.Annotations = map[string]string{}
		}
		po.Annotations["sdnsim/pid"] = fmt.Sprint(pid)
		upd, err := s.cfg.Client.CoreV1().Pods(Namespace).Update(ctx, po, metav1.UpdateOptions{})
		if err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		pod = upd
	}
	po := pod.DeepCopy()
	po.Status.Phase = corev1.PodRunning
	now := metav1.Now()
	po.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: now}}
	po.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, Image: imageOf(po.Spec), Ready: ready, RestartCount: restarts,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := s.cfg.Client.CoreV1().Pods(Namespace).UpdateStatus(ctx, po, metav1.UpdateOptions{}); err != nil &&
		!apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// PodReady reports whether pod's Ready condition is true.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
