package ovs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/cutover-dev/cutover/pkg/ovsdb"
)

// Interfaces implements Driver. One transaction reads the bridge, every
// port and every interface, and the bridge's are picked here: OVSDB has no
// join, and a second round trip could see the ports change in between.
func (c *Client) Interfaces(ctx context.Context, bridge string) ([]Interface, error) {
	ctx, cancel := c.bound(ctx, c.cfg.CallTimeout)
	defer cancel()
	db, err := c.db(ctx)
	if err != nil {
		return nil, err
	}
	res, err := db.Transact(ctx, dbName,
		ovsdb.Select("Bridge", []ovsdb.Condition{ovsdb.Where("name", "==", bridge)}, "ports"),
		ovsdb.Select("Port", nil, "_uuid", "interfaces"),
		ovsdb.Select("Interface", nil, ifaceColumns...))
	if err != nil {
		return nil, fmt.Errorf("ovs: read the interfaces of %s: %w", bridge, err)
	}
	if len(res[0].Rows) == 0 {
		return nil, &NotFoundError{Name: bridge, Kind: "bridge"}
	}
	ports, err := uuidSet(res[0].Rows[0]["ports"])
	if err != nil {
		return nil, fmt.Errorf("ovs: bridge %s: ports: %w", bridge, err)
	}
	mine := map[ovsdb.UUID]bool{}
	for _, r := range res[1].Rows {
		if id, _ := r["_uuid"].(ovsdb.UUID); ports[id] {
			ifs, err := uuidSet(r["interfaces"])
			if err != nil {
				return nil, fmt.Errorf("ovs: port %s: interfaces: %w", id, err)
			}
			for i := range ifs {
				mine[i] = true
			}
		}
	}
	var out []Interface
	for _, r := range res[2].Rows {
		iface, id, err := rowToInterface(r)
		if err != nil {
			return nil, err
		}
		if mine[id] {
			out = append(out, iface)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// uuidSet reads a set-of-uuid column.
func uuidSet(v any) (map[ovsdb.UUID]bool, error) {
	s, err := ovsdb.AsSet(v)
	if err != nil {
		return nil, err
	}
	out := make(map[ovsdb.UUID]bool, len(s))
	for _, a := range s {
		id, ok := a.(ovsdb.UUID)
		if !ok {
			return nil, fmt.Errorf("%T in a set of uuids", a)
		}
		out[id] = true
	}
	return out, nil
}

// ChangePorts implements Driver. It reads what c names, then writes one
// transaction:
//
//	wait   Interface[_uuid] options == <options as read>  (per move, timeout 0: the CAS)
//	insert Interface, Port; mutate Bridge ports insert     (per new port)
//	update Interface[_uuid] type, options, ofport_request  (per port there already)
//	update Interface[_uuid] options                        (per move)
//	mutate Bridge ports delete <Port uuid>                 (per port to delete: OVSDB
//	                                                        collects the unreferenced
//	                                                        Port and Interface rows)
//	mutate Open_vSwitch next_cfg += 1
//	select Open_vSwitch next_cfg
//
// and waits until ovs-vswitchd applied it (cur_cfg), as ovs-vsctl does.
// The ports' adds and deletes are mutations of the bridge's set, not a
// compare-and-set of it: another controller adding its own port meanwhile
// (the CNI, for a pod) must not fail ours; the name indexes of Port and
// Interface refuse a second port of one name.
func (c *Client) ChangePorts(ctx context.Context, pc PortsChange) error {
	ctx, cancel := c.bound(ctx, c.cfg.ApplyTimeout+c.cfg.CallTimeout)
	defer cancel()
	db, err := c.db(ctx)
	if err != nil {
		return err
	}
	// Watch before the write, as PrepareDstPort does.
	w, err := watchCfg(ctx, db)
	if err != nil {
		return err
	}
	defer w.close()
	ops, cas, err := c.portsTxn(ctx, db, pc)
	if err != nil {
		return err
	}
	target := w.next
	if len(ops) > 0 {
		ops = append(ops,
			ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("next_cfg", "+=", 1)),
			ovsdb.Select("Open_vSwitch", nil, "next_cfg"),
			ovsdb.Comment("cutover: "+pc.String()))
		if c.testHookBeforeWrite != nil {
			c.testHookBeforeWrite()
		}
		res, err := db.Transact(ctx, dbName, ops...)
		if err != nil {
			var oe *ovsdb.OpError
			if errors.As(err, &oe) && ovsdb.IsWaitFailed(err) && oe.Index < len(ops) {
				if m, ok := cas[oe.Index]; ok {
					now := "deleted"
					if got, _, gerr := getInterface(ctx, db, m.Name); gerr == nil {
						now = "options " + optionsString(got.Options)
					}
					return &ConflictError{Name: m.Name, Expected: m.From, Current: now, Err: err}
				}
			}
			return fmt.Errorf("ovs: %s: %w", pc, err)
		}
		rows := res[len(ops)-2].Rows
		if len(rows) != 1 {
			return fmt.Errorf("ovs: %d Open_vSwitch rows, want 1", len(rows))
		}
		if target, _, err = ovsdb.AsInt(rows[0]["next_cfg"]); err != nil {
			return fmt.Errorf("ovs: Open_vSwitch next_cfg: %w", err)
		}
	}
	if err := w.until(ctx, target); err != nil {
		return &NotAppliedError{What: pc.String(), NextCfg: target, CurCfg: w.cur, Err: err}
	}
	return nil
}

// portsTxn reads what pc names and returns the write's operations (none:
// nothing to do) and, by index, the moves whose compare-and-set each wait
// is.
func (c *Client) portsTxn(ctx context.Context, db *ovsdb.Client, pc PortsChange) ([]ovsdb.Operation, map[int]Move, error) {
	byName := func(table, name string, cols ...string) ovsdb.Operation {
		return ovsdb.Select(table, []ovsdb.Condition{ovsdb.Where("name", "==", name)}, cols...)
	}
	reads := []ovsdb.Operation{byName("Bridge", pc.Bridge, "_uuid", "ports")}
	for _, a := range pc.Add {
		reads = append(reads, byName("Port", a.Name, "_uuid"), byName("Interface", a.Name, "_uuid"))
	}
	for _, m := range pc.Move {
		reads = append(reads, byName("Interface", m.Name, ifaceColumns...))
	}
	for _, d := range pc.Del {
		reads = append(reads, byName("Port", d, "_uuid"))
	}
	res, err := db.Transact(ctx, dbName, reads...)
	if err != nil {
		return nil, nil, fmt.Errorf("ovs: read for %s: %w", pc, err)
	}
	if len(res[0].Rows) == 0 {
		return nil, nil, &NotFoundError{Name: pc.Bridge, Kind: "bridge"}
	}
	brID, _ := res[0].Rows[0]["_uuid"].(ovsdb.UUID)
	onBridge, err := uuidSet(res[0].Rows[0]["ports"])
	if err != nil {
		return nil, nil, fmt.Errorf("ovs: bridge %s: ports: %w", pc.Bridge, err)
	}
	bridge := []ovsdb.Condition{ovsdb.Where("_uuid", "==", brID)}
	self := func(id ovsdb.UUID) []ovsdb.Condition { return []ovsdb.Condition{ovsdb.Where("_uuid", "==", id)} }
	firstID := func(rows []ovsdb.Row) ovsdb.UUID {
		if len(rows) == 0 {
			return ""
		}
		id, _ := rows[0]["_uuid"].(ovsdb.UUID)
		return id
	}
	var ops, writes []ovsdb.Operation
	cas := map[int]Move{}
	next := 1
	for i, a := range pc.Add {
		portID, ifaceID := firstID(res[next].Rows), firstID(res[next+1].Rows)
		next += 2
		row := ovsdb.Row{"type": a.Type, "options": ovsdb.StringMap(a.Options), "ofport_request": ovsdb.Set{}}
		if a.OFPortRequest > 0 {
			row["ofport_request"] = a.OFPortRequest
		}
		switch {
		case portID == "" && ifaceID == "":
			row["name"] = a.Name
			ifName, portName := "iface"+strconv.Itoa(i), "port"+strconv.Itoa(i)
			writes = append(writes,
				ovsdb.Insert("Interface", row, ifName),
				ovsdb.Insert("Port", ovsdb.Row{"name": a.Name, "interfaces": ovsdb.NamedUUID(ifName)}, portName),
				ovsdb.Mutate("Bridge", bridge, ovsdb.Mut("ports", "insert", ovsdb.Set{ovsdb.NamedUUID(portName)})))
		case onBridge[portID] && ifaceID != "":
			// ovs-vsctl --may-exist add-port with its set interface: the
			// port stays, its interface gets what was asked.
			writes = append(writes, ovsdb.Update("Interface", self(ifaceID), row))
		default:
			return nil, nil, fmt.Errorf("ovs: add port %s to %s: a port or interface of that name is elsewhere (another bridge, another port); remove it first", a.Name, pc.Bridge)
		}
	}
	for _, m := range pc.Move {
		rows := res[next].Rows
		next++
		if len(rows) == 0 {
			return nil, nil, &NotFoundError{Name: m.Name}
		}
		cur, id, err := rowToInterface(rows[0])
		if err != nil {
			return nil, nil, err
		}
		options, noop, err := planDstPort(cur, m.From, m.To)
		if err != nil {
			return nil, nil, err
		}
		if noop {
			continue
		}
		cas[len(ops)] = m
		ops = append(ops, ovsdb.Wait("Interface", self(id), []string{"options"}, "==", []ovsdb.Row{{"options": ovsdb.StringMap(cur.Options)}}, 0))
		writes = append(writes, ovsdb.Update("Interface", self(id), ovsdb.Row{"options": ovsdb.StringMap(options)}))
	}
	var gone ovsdb.Set
	for range pc.Del {
		if id := firstID(res[next].Rows); id != "" && onBridge[id] {
			gone = append(gone, id)
		}
		next++
	}
	if len(gone) > 0 {
		writes = append(writes, ovsdb.Mutate("Bridge", bridge, ovsdb.Mut("ports", "delete", gone)))
	}
	if len(writes) == 0 {
		return nil, nil, nil
	}
	return append(ops, writes...), cas, nil
}
