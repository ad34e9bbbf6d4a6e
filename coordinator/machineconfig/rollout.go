package machineconfig

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Options configure a rollout.
type Options struct {
	Pool   string
	Config string // the rendered config; default the pool's spec.configuration.name
	// Nodes and Selector narrow the rollout to some of the pool's nodes.
	Nodes    []string
	Selector string
	// MaxUnavailable is a count or a percentage of the nodes rolled out.
	MaxUnavailable string
	Timeouts       Timeouts
	Drain          DrainConfig
	DryRun         bool
	Force          bool // run even while the MCC looks alive
	// JournalNamespace holds the journal ConfigMap (JournalName).
	JournalNamespace string
	// Poll is how often the nodes are read while waiting (default 2 s).
	Poll time.Duration
	// Progress receives live per-node progress; may be nil.
	Progress func(Event)
}

// DefaultOptions are the coordctl defaults.
func DefaultOptions() Options {
	return Options{
		MaxUnavailable:   "1",
		Timeouts:         Timeouts{MCD: 30 * time.Minute, Drain: time.Hour},
		JournalNamespace: MCCNamespace,
		Poll:             2 * time.Second,
	}
}

// Event is one line of live progress.
type Event struct {
	Time time.Time `json:"time"`
	Node string    `json:"node"`
	Step Step      `json:"step"`
	Msg  string    `json:"msg"`
}

// Report is a rollout's outcome (or, with DryRun, its plan).
type Report struct {
	Pool           string       `json:"pool"`
	Config         string       `json:"config"`
	State          string       `json:"state"` // Running (interrupted), Succeeded, Failed, DryRun, Refused, Stopped (another driver took over)
	Error          string       `json:"error,omitempty"`
	Resumed        bool         `json:"resumed,omitempty"`
	MaxUnavailable int          `json:"maxUnavailable"`
	MCC            MCC          `json:"mcc"`
	Journal        string       `json:"journal"`
	Nodes          []NodeReport `json:"nodes"`
}

// NodeReport is one node in a Report.
type NodeReport struct {
	NodeView
	Step      Step      `json:"step"`
	Next      Action    `json:"next,omitempty"` // dry run: what would be done now
	SawReboot bool      `json:"sawReboot,omitempty"`
	Started   time.Time `json:"started,omitzero"`
	Finished  time.Time `json:"finished,omitzero"`
}

// RefusedError is a rollout refused for a failed precondition; nothing
// was changed.
type RefusedError struct{ Why string }

func (e *RefusedError) Error() string { return e.Why }

// MCCBackError stops a rollout when the MCC comes back alive mid-way.
type MCCBackError struct{ MCC MCC }

func (e *MCCBackError) Error() string {
	return fmt.Sprintf("the machine-config-controller came back (%s): stopped here, it takes over the rollout (or run again with --force)", e.MCC.Why)
}

// Driver runs rollouts on a cluster.
type Driver struct {
	C   *Cluster
	Now func() time.Time // default time.Now
}

func (d *Driver) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// prepared is a validated rollout: nothing has been written yet.
type prepared struct {
	pool    *Pool
	target  string
	nodes   []string
	maxU    int
	mcc     MCC
	rec     *Record // the journal's record, nil when none
	resume  bool
	journal *journal
}

// prepare validates o against the cluster and writes nothing. Bad input is
// an *InputError.
func (d *Driver) prepare(ctx context.Context, o Options) (*prepared, error) {
	if o.Pool == "" {
		return nil, &InputError{Field: "--pool", Value: "", Reason: "required: the MachineConfigPool to roll out (e.g. worker)"}
	}
	if o.JournalNamespace == "" {
		return nil, &InputError{Field: "--journal-namespace", Value: "", Reason: "required"}
	}
	if o.Timeouts.MCD <= 0 {
		return nil, &InputError{Field: "--node-timeout", Value: o.Timeouts.MCD.String(), Reason: "must be positive"}
	}
	if o.Timeouts.Drain <= 0 {
		return nil, &InputError{Field: "--drain-timeout", Value: o.Timeouts.Drain.String(), Reason: "must be positive"}
	}
	var sel labels.Selector
	if o.Selector != "" {
		s, err := labels.Parse(o.Selector)
		if err != nil {
			return nil, &InputError{Field: "--selector", Value: o.Selector, Reason: err.Error()}
		}
		sel = s
	}
	pool, err := d.C.Pool(ctx, o.Pool)
	if err != nil {
		return nil, err
	}
	p := &prepared{pool: pool, journal: &journal{c: d.C, namespace: o.JournalNamespace, name: JournalName(pool.Name)}}
	if p.rec, err = p.journal.load(ctx); err != nil {
		return nil, err
	}
	rendered, err := d.C.RenderedConfigs(ctx, pool.Name)
	if err != nil {
		return nil, err
	}
	p.target = o.Config
	if p.rec != nil && p.rec.State != RolloutSucceeded {
		switch {
		case p.target == "":
			p.target, p.resume = p.rec.Config, true
		case p.target == p.rec.Config:
			p.resume = true
		case p.rec.State == RolloutRunning:
			return nil, &InputError{Field: "--config", Value: o.Config, Reason: fmt.Sprintf(
				"a rollout of pool %s to %s is in progress (journal ConfigMap %s/%s): resume it (rollout without --config) or, once you know no node is mid-update, delete that ConfigMap",
				pool.Name, p.rec.Config, o.JournalNamespace, p.journal.name)}
		}
	}
	if p.target == "" {
		p.target = pool.SpecConfig
	}
	if p.target == "" && len(rendered) > 0 {
		p.target = rendered[0].Name
	}
	if p.target == "" {
		return nil, &InputError{Field: "--pool", Value: pool.Name, Reason: "the pool names no rendered config (spec.configuration.name) and no MachineConfig is rendered for it: give --config"}
	}
	if !slices.ContainsFunc(rendered, func(r Rendered) bool { return r.Name == p.target }) {
		names := make([]string, 0, len(rendered))
		for _, r := range rendered {
			names = append(names, r.Name)
		}
		return nil, &InputError{Field: "--config", Value: p.target, Reason: fmt.Sprintf(
			"not a rendered MachineConfig of pool %s (it must exist and be owned by the pool); the pool's rendered configs, newest first: [%s]",
			pool.Name, strings.Join(names, ", "))}
	}
	poolNodes, err := d.C.PoolNodes(ctx, pool)
	if err != nil {
		return nil, err
	}
	if len(poolNodes) == 0 {
		return nil, &InputError{Field: "--pool", Value: pool.Name, Reason: "its spec.nodeSelector selects no node"}
	}
	inPool := map[string]corev1.Node{}
	var all []string
	for _, n := range poolNodes {
		inPool[n.Name] = n
		all = append(all, n.Name)
	}
	chosen := all
	if len(o.Nodes) > 0 {
		chosen = nil
		for _, n := range o.Nodes {
			if _, ok := inPool[n]; !ok {
				return nil, &InputError{Field: "--nodes", Value: n, Reason: fmt.Sprintf("not a node of pool %s (its nodes: %s)", pool.Name, strings.Join(all, ", "))}
			}
			if !slices.Contains(chosen, n) {
				chosen = append(chosen, n)
			}
		}
		slices.Sort(chosen)
	}
	if sel != nil {
		var keep []string
		for _, n := range chosen {
			if sel.Matches(labels.Set(inPool[n].Labels)) {
				keep = append(keep, n)
			}
		}
		if len(keep) == 0 {
			return nil, &InputError{Field: "--selector", Value: o.Selector, Reason: fmt.Sprintf("matches no node of pool %s (its nodes: %s)", pool.Name, strings.Join(chosen, ", "))}
		}
		chosen = keep
	}
	p.nodes = chosen
	if p.resume {
		if (len(o.Nodes) > 0 || o.Selector != "") && !slices.Equal(chosen, p.rec.Nodes) {
			return nil, &InputError{Field: "--nodes/--selector", Value: strings.Join(chosen, ","), Reason: fmt.Sprintf(
				"the journaled rollout of pool %s to %s covers [%s]; resume it with the same nodes (or without --nodes/--selector)",
				pool.Name, p.target, strings.Join(p.rec.Nodes, ", "))}
		}
		p.nodes = p.rec.Nodes
		for _, n := range p.nodes {
			if _, ok := inPool[n]; !ok {
				return nil, fmt.Errorf("node %s of the journaled rollout is no longer in pool %s", n, pool.Name)
			}
		}
	}
	if o.MaxUnavailable == "" {
		o.MaxUnavailable = "1"
	}
	if p.maxU, err = ParseMaxUnavailable(o.MaxUnavailable, len(p.nodes)); err != nil {
		return nil, &InputError{Field: "--max-unavailable", Value: o.MaxUnavailable, Reason: strings.TrimPrefix(err.Error(), fmt.Sprintf("--max-unavailable %q: ", o.MaxUnavailable))}
	}
	if p.mcc, err = d.C.MCCState(ctx, d.now()); err != nil {
		return nil, err
	}
	return p, nil
}

// Rollout runs (or with o.DryRun plans) the rollout o describes. The report
// is returned with every error but bad input. A cancelled ctx leaves the
// journal Running: the next Rollout of the pool resumes it.
func (d *Driver) Rollout(ctx context.Context, o Options) (*Report, error) {
	p, err := d.prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	rep := &Report{Pool: p.pool.Name, Config: p.target, MaxUnavailable: p.maxU, MCC: p.mcc, Resumed: p.resume,
		Journal: o.JournalNamespace + "/" + p.journal.name}
	views, err := d.views(ctx, p)
	if err != nil {
		return nil, err
	}
	var refused error
	if p.mcc.Alive && !o.Force {
		refused = &RefusedError{Why: fmt.Sprintf("the machine-config-controller looks alive (%s): it would fight this rollout; let it do the update, or stop it first, or give --force", p.mcc.Why)}
	}
	if o.DryRun {
		rep.State = "DryRun"
		starts := Start(p.target, views, p.maxU)
		for _, v := range views {
			s, a := Decide(p.target, v)
			if a == ActSetDesired && !slices.Contains(starts, v.Name) {
				a = ActWait
			}
			rep.Nodes = append(rep.Nodes, NodeReport{NodeView: v, Step: s, Next: a})
		}
		if refused != nil {
			rep.Error = refused.Error()
		}
		return rep, refused
	}
	if refused != nil {
		rep.State = "Refused"
		rep.Error = refused.Error()
		d.fill(rep, views, p.rec)
		return rep, refused
	}
	return d.run(ctx, o, p, rep)
}

// views reads the rollout's nodes in p.nodes order.
func (d *Driver) views(ctx context.Context, p *prepared) ([]NodeView, error) {
	nodes, err := d.C.PoolNodes(ctx, p.pool)
	if err != nil {
		return nil, err
	}
	by := map[string]NodeView{}
	for i := range nodes {
		by[nodes[i].Name] = ViewOf(&nodes[i])
	}
	out := make([]NodeView, 0, len(p.nodes))
	for _, n := range p.nodes {
		v, ok := by[n]
		if !ok {
			return nil, fmt.Errorf("node %s left pool %s (or was deleted) during the rollout", n, p.pool.Name)
		}
		out = append(out, v)
	}
	return out, nil
}

func (d *Driver) fill(rep *Report, views []NodeView, rec *Record) {
	rep.Nodes = rep.Nodes[:0]
	for _, v := range views {
		s, _ := Decide(rep.Config, v)
		nr := NodeReport{NodeView: v, Step: s}
		if rec != nil && rec.Node[v.Name] != nil {
			r := rec.Node[v.Name]
			nr.SawReboot, nr.Started, nr.Finished = r.SawReboot, r.Started, r.Finished
		}
		rep.Nodes = append(rep.Nodes, nr)
	}
}

func (d *Driver) run(ctx context.Context, o Options, p *prepared, rep *Report) (*Report, error) {
	now := d.now()
	rec := p.rec
	if !p.resume {
		rec = &Record{Pool: p.pool.Name, Config: p.target, Nodes: p.nodes, Started: now, Node: map[string]*NodeRecord{}}
	}
	if rec.State != RolloutRunning {
		// A failed rollout resumed after the operator fixed the node: its
		// waits start over, or the old step times would fail it at once.
		for _, nr := range rec.Node {
			nr.Since = now
		}
	}
	rec.State, rec.Error, rec.Updated = RolloutRunning, "", now
	if rec.Node == nil {
		rec.Node = map[string]*NodeRecord{}
	}
	if err := p.journal.save(ctx, rec); err != nil {
		if errors.Is(err, ErrJournalConflict) {
			// Another driver wrote the journal between our read and this
			// write: it carries on, this one has changed nothing.
			rep.State, rep.Error = RolloutStopped, err.Error()
			return rep, err
		}
		return nil, err
	}
	emit := func(node string, s Step, msg string) {
		if o.Progress != nil {
			o.Progress(Event{Time: d.now(), Node: node, Step: s, Msg: msg})
		}
	}
	poll := o.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	finish := func(views []NodeView, state string, err error) (*Report, error) {
		if errors.Is(err, ErrJournalConflict) {
			// Another driver owns the journal now: leave it to that one.
			rep.State, rep.Error = RolloutStopped, err.Error()
			d.fill(rep, views, rec)
			return rep, err
		}
		rec.State, rec.Updated = state, d.now()
		if err != nil {
			rec.Error = err.Error()
		}
		// The outcome must reach the journal even when ctx is done.
		if serr := p.journal.save(context.WithoutCancel(ctx), rec); serr != nil {
			if errors.Is(serr, ErrJournalConflict) {
				rep.State, rep.Error = RolloutStopped, serr.Error()
				d.fill(rep, views, rec)
				return rep, serr
			}
			if err == nil {
				err = serr
			}
		}
		rep.State, rep.Error = state, rec.Error
		d.fill(rep, views, rec)
		return rep, err
	}
	var views []NodeView
	for {
		if ctx.Err() != nil {
			rep.State = RolloutRunning
			d.fill(rep, views, rec)
			return rep, ctx.Err()
		}
		v, err := d.views(ctx, p)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return finish(views, RolloutFailed, err)
		}
		views = v
		now := d.now()
		changed, done := false, 0
		for _, v := range views {
			s, _ := Decide(p.target, v)
			nr := rec.Node[v.Name]
			if nr == nil {
				nr = &NodeRecord{Step: StepPending, Since: now}
				rec.Node[v.Name] = nr
				changed = true
			}
			if s != nr.Step {
				nr.Step, nr.Since, changed = s, now, true
				if s == StepDone {
					nr.Finished = now
				}
				emit(v.Name, s, fmt.Sprintf("desiredConfig=%s desiredDrain=%s lastAppliedDrain=%s currentConfig=%s state=%s", v.Desired, v.DesiredDrain, v.LastAppliedDrain, v.Current, v.State))
			}
			if s == StepWaitUncordonRequest && !v.Ready && !nr.SawReboot {
				nr.SawReboot, changed = true, true
				emit(v.Name, s, "NotReady: the MCD is rebooting the node")
			}
			if s == StepDone {
				done++
			}
			if s == StepFailed {
				return finish(views, RolloutFailed, &FailedError{Node: v.Name, State: v.State, Reason: v.Reason})
			}
			if err := Overdue(v.Name, s, nr.Since, now, o.Timeouts); err != nil {
				return finish(views, RolloutFailed, err)
			}
		}
		if changed {
			rec.Updated = now
			if err := p.journal.save(ctx, rec); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return finish(views, RolloutFailed, err)
			}
		}
		if done == len(views) {
			return finish(views, RolloutSucceeded, nil)
		}
		if !o.Force {
			// The MCC came back: it finishes the job itself, and two
			// controllers answering the same requests would fight.
			m, err := d.C.MCCState(ctx, d.now())
			if err == nil && m.Alive {
				return finish(views, RolloutStopped, &MCCBackError{MCC: m})
			}
		}
		if err := d.act(ctx, o, p, rec, views, emit); err != nil {
			if ctx.Err() != nil {
				continue
			}
			return finish(views, RolloutFailed, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
}

// act performs each node's action once.
func (d *Driver) act(ctx context.Context, o Options, p *prepared, rec *Record, views []NodeView, emit func(string, Step, string)) error {
	starts := Start(p.target, views, p.maxU)
	for _, v := range views {
		s, a := Decide(p.target, v)
		nr := rec.Node[v.Name]
		switch a {
		case ActSetDesired:
			if !slices.Contains(starts, v.Name) {
				continue
			}
			if err := d.C.annotate(ctx, v.Name, AnnoDesiredConfig, p.target); err != nil {
				return err
			}
			nr.Started = d.now()
			emit(v.Name, s, "set desiredConfig="+p.target)
		case ActDrain:
			emit(v.Name, s, "draining")
			deadline := nr.Since.Add(o.Timeouts.Drain)
			if !d.answersWithoutDrain() {
				if err := d.C.drain(ctx, v.Name, o.Drain, deadline, func(m string) { emit(v.Name, s, m) }); err != nil {
					return err
				}
			}
			if err := d.C.annotate(ctx, v.Name, AnnoLastAppliedDrain, DrainRequest(p.target)); err != nil {
				return err
			}
			nr.Drained = true
			emit(v.Name, s, "drained; answered lastAppliedDrain="+DrainRequest(p.target))
		case ActUncordon:
			if v.Unschedulable {
				if err := d.C.cordon(ctx, v.Name, false); err != nil {
					return err
				}
				emit(v.Name, s, "uncordoned")
			}
			if err := d.C.annotate(ctx, v.Name, AnnoLastAppliedDrain, UncordonRequest(p.target)); err != nil {
				return err
			}
			emit(v.Name, s, "answered lastAppliedDrain="+UncordonRequest(p.target))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}
