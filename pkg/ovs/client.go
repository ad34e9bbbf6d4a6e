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

var ifaceColumns = []string{"_uuid", "name", "type", "options", "ofport", "error"}

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
	return iface, id, nil
}

// SetDstPort implements Driver.
//
// The write is one transaction:
//
//	wait   Interface[_uuid] options == <options as read>  (timeout 0: the CAS)
//	wait   no other tunnel Interface has the new options   (timeout 0)
//	update Interface[_uuid] options = <options as read, dst_port=to>
//	mutate Open_vSwitch next_cfg += 1
//	select Open_vSwitch next_cfg                            (the value to wait for)
//
// followed by a wait (monitor) until cur_cfg >= that next_cfg, and a read-back.
func (c *Client) SetDstPort(ctx context.Context, name string, from, to uint16) (Interface, error) {
	ctx, cancel := c.bound(ctx, c.cfg.ApplyTimeout+c.cfg.CallTimeout)
	defer cancel()
	db, err := c.db(ctx)
	if err != nil {
		return Interface{}, err
	}
	cur, id, err := getInterface(ctx, db, name)
	if err != nil {
		return Interface{}, err
	}
	options, noop, err := planDstPort(cur, from, to)
	if err != nil {
		return cur, err
	}
	// Monitor before the write: the cur_cfg update may follow the commit
	// by microseconds and must not be missed.
	mon, err := db.Monitor(ctx, dbName, map[string]ovsdb.MonitorRequest{"Open_vSwitch": {Columns: []string{"cur_cfg", "next_cfg"}}})
	if err != nil {
		return cur, fmt.Errorf("ovs: monitor cur_cfg: %w", err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = mon.Cancel(cctx)
		ccancel()
	}()
	curCfg, nextCfg := cfgOf(mon.Initial)

	if !noop {
		self := []ovsdb.Condition{ovsdb.Where("_uuid", "==", id)}
		ops := []ovsdb.Operation{
			ovsdb.Wait("Interface", self, []string{"options"}, "==", []ovsdb.Row{{"options": ovsdb.StringMap(cur.Options)}}, 0),
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
		if c.testHookBeforeWrite != nil {
			c.testHookBeforeWrite()
		}
		ops = append(ops,
			ovsdb.Update("Interface", self, ovsdb.Row{"options": ovsdb.StringMap(options)}),
			ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("next_cfg", "+=", 1)),
			ovsdb.Select("Open_vSwitch", nil, "next_cfg"),
			ovsdb.Comment(fmt.Sprintf("cutover: %s options:dst_port %d -> %d", name, from, to)),
		)
		res, err := db.Transact(ctx, dbName, ops...)
		if err != nil {
			return cur, c.txnError(ctx, db, cur, from, to, nWaits, err)
		}
		rows := res[nWaits+2].Rows
		if len(rows) != 1 {
			return cur, fmt.Errorf("ovs: %d Open_vSwitch rows, want 1", len(rows))
		}
		if nextCfg, _, err = ovsdb.AsInt(rows[0]["next_cfg"]); err != nil {
			return cur, fmt.Errorf("ovs: Open_vSwitch next_cfg: %w", err)
		}
	}
	// Also for a no-op: a replay right after a commit must not report
	// success before ovs-vswitchd applied it.
	for curCfg < nextCfg {
		u, err := mon.Next(ctx)
		if err != nil {
			return cur, &NotAppliedError{Name: name, NextCfg: nextCfg, CurCfg: curCfg, Err: err}
		}
		if cc, _ := cfgOf(u); cc > curCfg {
			curCfg = cc
		}
	}
	got, _, err := getInterface(ctx, db, name)
	if err != nil {
		return got, err
	}
	if p, err := got.DstPort(); err != nil || p != to {
		return got, &ConflictError{Name: name, Expected: to, Current: "options:dst_port=" + strconv.Quote(got.Options["dst_port"]) + " after commit"}
	}
	if err := portFailure(got); err != nil {
		return got, err
	}
	return got, nil
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
