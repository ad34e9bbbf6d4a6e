package ovs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/ovsdb"
)

const dbName = "Open_vSwitch"

// Config configures a Client.
type Config struct {
	// Addr is ovsdb-server's address: unix:/path or tcp:host:port.
	Addr string
	// ApplyTimeout bounds the wait for ovs-vswitchd to apply a change
	// (cur_cfg) when the caller's context has no earlier deadline.
	ApplyTimeout time.Duration
	// CallTimeout bounds each OVSDB call whose context has no deadline.
	CallTimeout time.Duration
}

// DefaultAddr is the system ovsdb-server's socket.
const DefaultAddr = "unix:/var/run/openvswitch/db.sock"

// Default fills unset fields.
func (c Config) Default() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = 10 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 10 * time.Second
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.ApplyTimeout < 0 {
		return fmt.Errorf("ovs: ApplyTimeout %s: must not be negative", c.ApplyTimeout)
	}
	if c.CallTimeout < 0 {
		return fmt.Errorf("ovs: CallTimeout %s: must not be negative", c.CallTimeout)
	}
	return nil
}

// Client is the Driver over a real ovsdb-server. It dials lazily and redials
// after the connection dies (ovsdb-server restarted), never mid-call.
type Client struct {
	cfg Config

	mu   sync.Mutex
	conn *ovsdb.Client

	// testHookBeforeWrite runs between the read and the write transaction
	// (tests race another controller against the CAS with it).
	testHookBeforeWrite func()
	// testNoCAS leaves the compare-and-set on the row's options out of
	// the write (TestPreparedCASBites shows what it guards).
	testNoCAS bool
}

var _ Driver = (*Client)(nil)

// New returns a Client; it connects on first use.
func New(cfg Config) (*Client, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := ovsdbAddr(cfg.Addr); err != nil {
		return nil, err
	}
	return &Client{cfg: cfg}, nil
}

func ovsdbAddr(a string) (string, error) {
	if len(a) > 5 && (a[:5] == "unix:" || a[:4] == "tcp:") {
		return a, nil
	}
	return "", fmt.Errorf("ovs: Addr %q: want unix:/path or tcp:host:port", a)
}

// Close drops the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

func (c *Client) db(ctx context.Context) (*ovsdb.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && c.conn.Err() == nil {
		return c.conn, nil
	}
	conn, err := ovsdb.Dial(ctx, c.cfg.Addr)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return conn, nil
}

func (c *Client) bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// Ping implements Driver.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := c.bound(ctx, c.cfg.CallTimeout)
	defer cancel()
	db, err := c.db(ctx)
	if err != nil {
		return err
	}
	return db.Echo(ctx)
}

var ifaceColumns = []string{"_uuid", "name", "type", "options", "ofport", "error", "ofport_request", "mtu_request"}

// GetInterface implements Driver.
func (c *Client) GetInterface(ctx context.Context, name string) (Interface, error) {
	ctx, cancel := c.bound(ctx, c.cfg.CallTimeout)
	defer cancel()
	db, err := c.db(ctx)
	if err != nil {
		return Interface{}, err
	}
	iface, _, err := getInterface(ctx, db, name)
	return iface, err
}

func getInterface(ctx context.Context, db *ovsdb.Client, name string) (Interface, ovsdb.UUID, error) {
	res, err := db.Transact(ctx, dbName, ovsdb.Select("Interface", []ovsdb.Condition{ovsdb.Where("name", "==", name)}, ifaceColumns...))
	if err != nil {
		return Interface{}, "", fmt.Errorf("ovs: read interface %s: %w", name, err)
	}
	if len(res[0].Rows) == 0 {
		return Interface{}, "", &NotFoundError{Name: name}
	}
	return rowToInterface(res[0].Rows[0])
}

func rowToInterface(r ovsdb.Row) (Interface, ovsdb.UUID, error) {
	var iface Interface
	id, _ := r["_uuid"].(ovsdb.UUID)
	var err error
	if iface.Name, _, err = ovsdb.AsString(r["name"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: name: %w", id, err)
	}
	if iface.Type, _, err = ovsdb.AsString(r["type"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: type: %w", iface.Name, err)
	}
	if iface.Options, err = ovsdb.AsStringMap(r["options"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: options: %w", iface.Name, err)
	}
	if iface.OFPort, _, err = ovsdb.AsInt(r["ofport"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: ofport: %w", iface.Name, err)
	}
	if iface.Error, _, err = ovsdb.AsString(r["error"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: error: %w", iface.Name, err)
	}
	if iface.OFPortRequest, _, err = ovsdb.AsInt(r["ofport_request"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: ofport_request: %w", iface.Name, err)
	}
	if iface.MTURequest, _, err = ovsdb.AsInt(r["mtu_request"]); err != nil {
		return iface, "", fmt.Errorf("ovs: Interface %s: mtu_request: %w", iface.Name, err)
	}
	return iface, id, nil
}

// SetDstPort implements Driver: PrepareDstPort then Apply, for a change
// that has no instant to prepare for (a revert, a replay after a restart).
func (c *Client) SetDstPort(ctx context.Context, name string, from, to uint16) (Interface, error) {
	ctx, cancel := c.bound(ctx, c.cfg.ApplyTimeout+c.cfg.CallTimeout)
	defer cancel()
	p, err := c.PrepareDstPort(ctx, name, from, to)
	if err != nil {
		return p.Current(), err
	}
	defer p.Close()
	return p.Apply(ctx)
}

// PrepareDstPort implements Driver. It reads the interface, builds the
// write and opens the cur_cfg monitor: two round trips, all before the
// instant. The write is one transaction:
//
//	wait   Interface[_uuid] options == <options as read>  (timeout 0: the CAS)
//	wait   no other tunnel Interface has the new options   (timeout 0)
//	update Interface[_uuid] options = <options as read, dst_port=to>
//	mutate Open_vSwitch next_cfg += 1
//	select Open_vSwitch next_cfg                            (the value to wait for)
//
// Apply sends it, waits on the monitor until cur_cfg >= that next_cfg, and
// reads back. The first wait is why building it early is safe: if anything
// changed the row's options between Prepare and Apply, the transaction
// fails as a *ConflictError and writes nothing, so stale options are never
// applied.
func (c *Client) PrepareDstPort(ctx context.Context, name string, from, to uint16) (PreparedChange, error) {
	ctx, cancel := c.bound(ctx, c.cfg.CallTimeout)
	defer cancel()
	p := &prepared{c: c, name: name, from: from, to: to}
	db, err := c.db(ctx)
	if err != nil {
		return p, err
	}
	cur, id, err := getInterface(ctx, db, name)
	p.cur = cur
	if err != nil {
		return p, err
	}
	options, noop, err := planDstPort(cur, from, to)
	if err != nil {
		return p, err
	}
	p.noop = noop
	if !noop {
		p.ops, p.nWaits = c.buildDstPortTxn(cur, id, options, from, to)
	}
	// Monitor before the write: the cur_cfg update may follow the commit
	// by microseconds and must not be missed.
	if err := p.watch(ctx, db); err != nil {
		return p, err
	}
	return p, nil
}

// buildDstPortTxn returns the write transaction's operations and how many
// of them are the leading waits (for txnError's decoding).
func (c *Client) buildDstPortTxn(cur Interface, id ovsdb.UUID, options map[string]string, from, to uint16) ([]ovsdb.Operation, int) {
	self := []ovsdb.Condition{ovsdb.Where("_uuid", "==", id)}
	cas := ovsdb.Wait("Interface", self, []string{"options"}, "==", []ovsdb.Row{{"options": ovsdb.StringMap(cur.Options)}}, 0)
	if c.testNoCAS {
		cas = ovsdb.Wait("Interface", self, []string{"name"}, "==", []ovsdb.Row{{"name": cur.Name}}, 0)
	}
	ops := []ovsdb.Operation{
		cas,
		ovsdb.Wait("Interface", []ovsdb.Condition{
			ovsdb.Where("_uuid", "!=", id), ovsdb.Where("type", "==", cur.Type), ovsdb.Where("options", "==", ovsdb.StringMap(options)),
		}, []string{"name"}, "==", nil, 0),
	}
	// dst_port absent means the type's default: an interface without
	// it is on to as well.
	if to == defaultDstPort[cur.Type] {
		implicit := make(map[string]string, len(options))
		for k, v := range options {
			if k != "dst_port" {
				implicit[k] = v
			}
		}
		ops = append(ops, ovsdb.Wait("Interface", []ovsdb.Condition{
			ovsdb.Where("_uuid", "!=", id), ovsdb.Where("type", "==", cur.Type), ovsdb.Where("options", "==", ovsdb.StringMap(implicit)),
		}, []string{"name"}, "==", nil, 0))
	}
	nWaits := len(ops)
	ops = append(ops,
		ovsdb.Update("Interface", self, ovsdb.Row{"options": ovsdb.StringMap(options)}),
		ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("next_cfg", "+=", 1)),
		ovsdb.Select("Open_vSwitch", nil, "next_cfg"),
		ovsdb.Comment(fmt.Sprintf("cutover: %s options:dst_port %d -> %d", cur.Name, from, to)),
	)
	return ops, nWaits
}

// prepared is Client's PreparedChange.
type prepared struct {
	c             *Client
	name          string
	from, to      uint16
	cur           Interface
	noop          bool
	ops           []ovsdb.Operation
	nWaits        int
	db            *ovsdb.Client
	w             *cfgWatch
	target        int64 // next_cfg to wait for
	used, closed  bool
	sent, applied time.Time
}

// watch opens the cur_cfg monitor on db. For a no-op the value to wait for
// is the next_cfg already pending: a replay right after a commit must not
// report success before ovs-vswitchd applied it.
func (p *prepared) watch(ctx context.Context, db *ovsdb.Client) error {
	w, err := watchCfg(ctx, db)
	if err != nil {
		return err
	}
	p.db, p.w, p.target = db, w, w.next
	return nil
}

func (p *prepared) Current() Interface { return p.cur }

func (p *prepared) Timing() (sent, confirmed time.Time) { return p.sent, p.applied }

func (p *prepared) Apply(ctx context.Context) (Interface, error) {
	if p.closed || p.used {
		return p.cur, fmt.Errorf("ovs: prepared change of %s %d -> %d: already applied or closed", p.name, p.from, p.to)
	}
	p.used = true
	if p.db == nil {
		return p.cur, fmt.Errorf("ovs: prepared change of %s %d -> %d: Prepare failed, nothing to apply", p.name, p.from, p.to)
	}
	ctx, cancel := p.c.bound(ctx, p.c.cfg.ApplyTimeout+p.c.cfg.CallTimeout)
	defer cancel()
	if p.db.Err() != nil {
		// ovsdb-server restarted (or the connection dropped) since
		// Prepare: the monitor is gone, the transaction is not. Watch
		// again on a fresh connection and send the same transaction; its
		// compare-and-set still decides whether it applies.
		db, err := p.c.db(ctx)
		if err != nil {
			return p.cur, err
		}
		if err := p.watch(ctx, db); err != nil {
			return p.cur, err
		}
	}
	if !p.noop {
		if p.c.testHookBeforeWrite != nil {
			p.c.testHookBeforeWrite()
		}
		p.sent = time.Now()
		res, err := p.db.Transact(ctx, dbName, p.ops...)
		if err != nil {
			return p.cur, p.c.txnError(ctx, p.db, p.cur, p.from, p.to, p.nWaits, err)
		}
		rows := res[p.nWaits+2].Rows
		if len(rows) != 1 {
			return p.cur, fmt.Errorf("ovs: %d Open_vSwitch rows, want 1", len(rows))
		}
		if p.target, _, err = ovsdb.AsInt(rows[0]["next_cfg"]); err != nil {
			return p.cur, fmt.Errorf("ovs: Open_vSwitch next_cfg: %w", err)
		}
	}
	if err := p.w.until(ctx, p.target); err != nil {
		return p.cur, &NotAppliedError{Name: p.name, NextCfg: p.target, CurCfg: p.w.cur, Err: err}
	}
	if !p.noop {
		p.applied = time.Now()
	}
	got, _, err := getInterface(ctx, p.db, p.name)
	if err != nil {
		return got, err
	}
	if port, err := got.DstPort(); err != nil || port != p.to {
		return got, &ConflictError{Name: p.name, Expected: p.to, Current: "options:dst_port=" + strconv.Quote(got.Options["dst_port"]) + " after commit"}
	}
	if err := portFailure(got); err != nil {
		return got, err
	}
	return got, nil
}

func (p *prepared) Close() {
	if p.closed {
		return
	}
	p.closed = true
	if p.w != nil {
		p.w.close()
	}
}

// txnError turns a failed write into the driver's typed errors.
func (c *Client) txnError(ctx context.Context, db *ovsdb.Client, cur Interface, from, to uint16, nWaits int, err error) error {
	var oe *ovsdb.OpError
	if !errors.As(err, &oe) || !ovsdb.IsWaitFailed(err) || oe.Index >= nWaits {
		return fmt.Errorf("ovs: set %s options:dst_port=%d: %w", cur.Name, to, err)
	}
	if oe.Index == 0 {
		now := "deleted"
		if got, _, gerr := getInterface(ctx, db, cur.Name); gerr == nil {
			now = "options " + optionsString(got.Options)
		}
		return &ConflictError{Name: cur.Name, Expected: from, Current: now, Err: err}
	}
	other := "another interface"
	if res, serr := db.Transact(ctx, dbName, ovsdb.Select("Interface", []ovsdb.Condition{
		ovsdb.Where("type", "==", cur.Type), ovsdb.Where("name", "!=", cur.Name)}, ifaceColumns...)); serr == nil {
		want := cur
		want.Options = map[string]string{}
		for k, v := range cur.Options {
			want.Options[k] = v
		}
		want.Options["dst_port"] = strconv.Itoa(int(to))
		for _, r := range res[0].Rows {
			if o, _, rerr := rowToInterface(r); rerr == nil && sameTunnelPort(o, want) {
				other = "interface " + o.Name
				break
			}
		}
	}
	return &PortError{Iface: cur, Reason: fmt.Sprintf("dst_port %d would give it the same tunnel configuration as %s (ovs-vswitchd would not tell them apart)", to, other), Err: err}
}

// sameTunnelPort is sameTunnel with an absent dst_port read as the default.
func sameTunnelPort(a, b Interface) bool {
	pa, ea := a.DstPort()
	pb, eb := b.DstPort()
	if ea != nil || eb != nil || pa != pb {
		return false
	}
	strip := func(i Interface) Interface {
		o := make(map[string]string, len(i.Options))
		for k, v := range i.Options {
			if k != "dst_port" {
				o[k] = v
			}
		}
		i.Options = o
		return i
	}
	return sameTunnel(strip(a), strip(b))
}

// cfgWatch follows Open_vSwitch cur_cfg, so that a writer can wait for
// ovs-vswitchd to apply the next_cfg its transaction set: what ovs-vsctl
// waits for unless told --no-wait.
type cfgWatch struct {
	mon       *ovsdb.Monitor
	cur, next int64 // cur_cfg seen; next_cfg when the watch opened
}

// watchCfg opens the monitor. It must be open before the write it waits
// for: the cur_cfg update may follow the commit by microseconds.
func watchCfg(ctx context.Context, db *ovsdb.Client) (*cfgWatch, error) {
	mon, err := db.Monitor(ctx, dbName, map[string]ovsdb.MonitorRequest{"Open_vSwitch": {Columns: []string{"cur_cfg", "next_cfg"}}})
	if err != nil {
		return nil, fmt.Errorf("ovs: monitor cur_cfg: %w", err)
	}
	w := &cfgWatch{mon: mon}
	w.cur, w.next = cfgOf(mon.Initial)
	return w, nil
}

// until waits until cur_cfg >= target.
func (w *cfgWatch) until(ctx context.Context, target int64) error {
	for w.cur < target {
		u, err := w.mon.Next(ctx)
		if err != nil {
			return err
		}
		if cc, _ := cfgOf(u); cc > w.cur {
			w.cur = cc
		}
	}
	return nil
}

func (w *cfgWatch) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = w.mon.Cancel(ctx)
	cancel()
}

// cfgOf extracts cur_cfg and next_cfg from Open_vSwitch updates (0 if absent).
func cfgOf(u ovsdb.TableUpdates) (cur, next int64) {
	for _, ru := range u["Open_vSwitch"] {
		if ru.New == nil {
			continue
		}
		if v, ok := ru.New["cur_cfg"]; ok {
			cur, _, _ = ovsdb.AsInt(v)
		}
		if v, ok := ru.New["next_cfg"]; ok {
			next, _, _ = ovsdb.AsInt(v)
		}
	}
	return cur, next
}
