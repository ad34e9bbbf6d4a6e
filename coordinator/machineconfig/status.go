package machineconfig

import (
	"context"
	"time"
)

// PoolStatus is `coordctl machineconfig status`: the pool, its rendered
// configs, the MCC's liveness, every node's protocol state and the
// journaled rollout if any.
type PoolStatus struct {
	Pool         string       `json:"pool"`
	SpecConfig   string       `json:"specConfig"`   // the config the pool's spec points at
	StatusConfig string       `json:"statusConfig"` // the config the pool reports it is on
	Newest       string       `json:"newest"`       // the newest rendered config of the pool
	Paused       bool         `json:"paused,omitempty"`
	MCC          MCC          `json:"mcc"`
	Nodes        []NodeStatus `json:"nodes"`
	Rollout      *Record      `json:"rollout,omitempty"`
	Rendered     []string     `json:"rendered"`
	Time         time.Time    `json:"time"`
}

// NodeStatus is one node: its annotations and its step toward the target
// (the journaled rollout's config, else the pool's spec config).
type NodeStatus struct {
	NodeView
	Step Step `json:"step"`
}

// Status reads pool's state; it writes nothing.
func (d *Driver) Status(ctx context.Context, pool, journalNamespace string) (*PoolStatus, error) {
	p, err := d.C.Pool(ctx, pool)
	if err != nil {
		return nil, err
	}
	st := &PoolStatus{Pool: p.Name, SpecConfig: p.SpecConfig, StatusConfig: p.StatusConfig, Paused: p.Paused, Time: d.now()}
	rendered, err := d.C.RenderedConfigs(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	for _, r := range rendered {
		st.Rendered = append(st.Rendered, r.Name)
	}
	if len(rendered) > 0 {
		st.Newest = rendered[0].Name
	}
	if st.MCC, err = d.C.MCCState(ctx, d.now()); err != nil {
		return nil, err
	}
	j := &journal{c: d.C, namespace: journalNamespace, name: JournalName(p.Name)}
	if st.Rollout, err = j.load(ctx); err != nil {
		return nil, err
	}
	target := p.SpecConfig
	if st.Rollout != nil && st.Rollout.State != RolloutSucceeded {
		target = st.Rollout.Config
	}
	nodes, err := d.C.PoolNodes(ctx, p)
	if err != nil {
		return nil, err
	}
	for i := range nodes {
		v := ViewOf(&nodes[i])
		s, _ := Decide(target, v)
		st.Nodes = append(st.Nodes, NodeStatus{NodeView: v, Step: s})
	}
	return st, nil
}
