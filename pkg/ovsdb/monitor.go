package ovsdb

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
)

// MonitorRequest says which columns of a table to monitor (all when none).
type MonitorRequest struct {
	Columns []string `json:"columns,omitempty"`
}

// RowUpdate is a row's change: Old is nil for an insert (and holds only the
// changed columns for a modify), New is nil for a delete.
type RowUpdate struct {
	Old Row `json:"old,omitempty"`
	New Row `json:"new,omitempty"`
}

// TableUpdates are row updates by table and row UUID.
type TableUpdates map[string]map[UUID]RowUpdate

// UnmarshalJSON decodes table-updates (RFC 7047 4.1.6).
func (t *TableUpdates) UnmarshalJSON(data []byte) error {
	var raw map[string]map[string]RowUpdate
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("table-updates: %w", err)
	}
	out := make(TableUpdates, len(raw))
	for table, rows := range raw {
		m := make(map[UUID]RowUpdate, len(rows))
		for id, ru := range rows {
			if !validUUID(id) {
				return fmt.Errorf("table-updates %s: row key %q is not a uuid", table, id)
			}
			m[UUID(id)] = ru
		}
		out[table] = m
	}
	*t = out
	return nil
}

// Monitor is an active monitor: Initial holds the rows at its start, Next
// returns later changes in order. Updates queue without bound until read,
// so the connection's reader never blocks on a slow consumer.
type Monitor struct {
	Initial TableUpdates

	c      *Client
	id     string
	mu     sync.Mutex
	queue  []TableUpdates
	err    error
	notify chan struct{}
}

// Monitor starts monitoring tables of db.
func (c *Client) Monitor(ctx context.Context, db string, reqs map[string]MonitorRequest) (*Monitor, error) {
	m := &Monitor{c: c, id: "cutover-mon-" + strconv.FormatUint(c.nextMon.Add(1), 10), notify: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	// Registered before the request: the server may send updates right
	// after its reply and the reader must have somewhere to put them.
	c.monitors[m.id] = m
	c.mu.Unlock()
	unregister := func() {
		c.mu.Lock()
		delete(c.monitors, m.id)
		c.mu.Unlock()
	}
	var initial TableUpdates
	if err := c.Call(ctx, "monitor", []any{db, m.id, reqs}, &initial); err != nil {
		unregister()
		return nil, err
	}
	m.Initial = initial
	return m, nil
}

// Next returns the next batch of updates, waiting for one until ctx ends or
// the connection dies.
func (m *Monitor) Next(ctx context.Context) (TableUpdates, error) {
	for {
		m.mu.Lock()
		if len(m.queue) > 0 {
			u := m.queue[0]
			m.queue = m.queue[1:]
			m.mu.Unlock()
			return u, nil
		}
		err := m.err
		m.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-m.notify:
		case <-ctx.Done():
			return nil, fmt.Errorf("ovsdb: monitor %s: %w", m.id, ctx.Err())
		}
	}
}

// Cancel stops the monitor on the server and locally.
func (m *Monitor) Cancel(ctx context.Context) error {
	m.c.mu.Lock()
	delete(m.c.monitors, m.id)
	m.c.mu.Unlock()
	m.close(fmt.Errorf("ovsdb: monitor %s: cancelled", m.id))
	return m.c.Call(ctx, "monitor_cancel", []any{m.id}, nil)
}

func (m *Monitor) close(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

func (c *Client) deliverUpdate(params json.RawMessage) {
	var p []json.RawMessage
	if json.Unmarshal(params, &p) != nil || len(p) != 2 {
		return
	}
	var id string
	if json.Unmarshal(p[0], &id) != nil {
		return
	}
	var tu TableUpdates
	if err := json.Unmarshal(p[1], &tu); err != nil {
		c.mu.Lock()
		m := c.monitors[id]
		c.mu.Unlock()
		if m != nil {
			m.close(fmt.Errorf("ovsdb: monitor %s: bad update: %w", id, err))
		}
		return
	}
	c.mu.Lock()
	m := c.monitors[id]
	c.mu.Unlock()
	if m == nil {
		return
	}
	m.mu.Lock()
	m.queue = append(m.queue, tu)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}
