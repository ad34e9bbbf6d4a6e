// Package ovsdb is a small OVSDB client (RFC 7047): JSON-RPC 1.0 over a unix
// or TCP stream, with transact, echo and monitor.
//
// It owns the wire protocol only: connections, request multiplexing, value
// encoding and the mapping of OVSDB errors to typed Go errors. It knows no
// schema and no Open vSwitch semantics (that is pkg/ovs), and it never
// retries a transaction: whether a retry is safe is the caller's decision.
//
// Every Go OVSDB library is refused by this project's module proxy; this one
// implements the subset the project uses and tests it against ovsdb-server.
package ovsdb

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Client is one OVSDB connection. Its methods are safe for concurrent use;
// concurrent calls are multiplexed by JSON-RPC id.
type Client struct {
	conn net.Conn

	wmu sync.Mutex // serialises writes

	mu       sync.Mutex
	pending  map[uint64]chan response
	monitors map[string]*Monitor
	err      error // set once the connection is dead
	done     chan struct{}

	nextID  atomic.Uint64
	nextMon atomic.Uint64
}

type response struct {
	result json.RawMessage
	error  json.RawMessage
	err    error // connection-level failure
}

// message is any JSON-RPC 1.0 message: request, notification or response.
type message struct {
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
	ID     json.RawMessage `json:"id"`
}

// Dial connects to addr, "unix:/path/to/db.sock" or "tcp:host:port".
func Dial(ctx context.Context, addr string) (*Client, error) {
	network, target, ok := strings.Cut(addr, ":")
	if !ok || target == "" || (network != "unix" && network != "tcp") {
		return nil, fmt.Errorf("ovsdb: address %q: want unix:/path or tcp:host:port", addr)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, target)
	if err != nil {
		return nil, fmt.Errorf("ovsdb: dial %s: %w", addr, err)
	}
	return NewClient(conn), nil
}

// NewClient speaks OVSDB over an established connection and owns it.
func NewClient(conn net.Conn) *Client {
	c := &Client{
		conn:     conn,
		pending:  map[uint64]chan response{},
		monitors: map[string]*Monitor{},
		done:     make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// Close closes the connection; pending calls fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	c.fail(ErrClosed)
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Done is closed when the connection is dead; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is the reason the connection died, nil while it is alive.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) readLoop() {
	dec := json.NewDecoder(bufio.NewReaderSize(c.conn, 64<<10))
	for {
		var m message
		if err := dec.Decode(&m); err != nil {
			_ = c.conn.Close()
			c.fail(fmt.Errorf("%w: read: %w", ErrClosed, err))
			close(c.done)
			return
		}
		if err := c.dispatch(&m); err != nil {
			_ = c.conn.Close()
			c.fail(fmt.Errorf("%w: %w", ErrClosed, err))
			close(c.done)
			return
		}
	}
}

// dispatch routes one incoming message. A protocol violation returns an
// error that kills the connection: after one, nothing read is trustworthy.
func (c *Client) dispatch(m *message) error {
	if m.Method != "" {
		hasID := len(m.ID) > 0 && string(m.ID) != "null"
		switch {
		case m.Method == "echo" && hasID:
			// ovsdb-server probes idle clients with echo and disconnects
			// those that do not answer.
			params := m.Params
			if len(params) == 0 {
				params = json.RawMessage("[]")
			}
			go func() {
				_ = c.write(context.Background(), &message{Result: params, Error: json.RawMessage("null"), ID: m.ID})
			}()
		case m.Method == "update" && !hasID:
			c.deliverUpdate(m.Params)
		case hasID:
			id := m.ID
			go func() {
				_ = c.write(context.Background(), &message{Result: json.RawMessage("null"), Error: json.RawMessage(`"unknown method"`), ID: id})
			}()
		}
		return nil
	}
	id, err := strconv.ParseUint(string(m.ID), 10, 64)
	if err != nil {
		// We only send numeric ids; anything else is not an answer to us.
		return fmt.Errorf("response with unexpected id %s", m.ID)
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ok {
		ch <- response{result: m.Result, error: m.Error}
	}
	// A response for a call whose caller gave up (context) is dropped.
	return nil
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	for id, ch := range c.pending {
		ch <- response{err: c.err}
		delete(c.pending, id)
	}
	for _, mon := range c.monitors {
		mon.close(c.err)
	}
}

func (c *Client) write(ctx context.Context, m *message) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("ovsdb: encode %s: %w", m.Method, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	dl, _ := ctx.Deadline()
	_ = c.conn.SetWriteDeadline(dl)
	if _, err := c.conn.Write(data); err != nil {
		// A partial write leaves the stream unframed: the connection is done.
		_ = c.conn.Close()
		return fmt.Errorf("%w: write: %w", ErrClosed, err)
	}
	return nil
}

// call sends a request and waits for its response or ctx.
func (c *Client) call(ctx context.Context, method string, params any) (response, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return response{}, fmt.Errorf("ovsdb: %s: encode params: %w", method, err)
	}
	id := c.nextID.Add(1)
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return response{}, err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	if err := c.write(ctx, &message{Method: method, Params: p, ID: json.RawMessage(strconv.FormatUint(id, 10))}); err != nil {
		forget()
		return response{}, err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return response{}, r.err
		}
		return r, nil
	case <-ctx.Done():
		forget()
		return response{}, fmt.Errorf("ovsdb: %s: %w", method, ctx.Err())
	}
}

// Requests is how many requests this client has sent: what a caller that
// must send few messages at a given instant (a prepared change) tests with.
func (c *Client) Requests() uint64 { return c.nextID.Load() }

// Call sends any method and decodes its result into result (if not nil).
// A JSON-RPC error answer is an *RPCError.
func (c *Client) Call(ctx context.Context, method string, params []any, result any) error {
	if params == nil {
		params = []any{}
	}
	r, err := c.call(ctx, method, params)
	if err != nil {
		return err
	}
	if e := rpcErrorText(r.error); e != "" {
		return &RPCError{Method: method, Err: e}
	}
	if result != nil {
		if err := json.Unmarshal(r.result, result); err != nil {
			return fmt.Errorf("ovsdb: %s: decode result: %w", method, err)
		}
	}
	return nil
}

// rpcErrorText renders a JSON-RPC "error" member; "" when it is null/absent.
func rpcErrorText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Error   string `json:"error"`
		Details string `json:"details"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Error != "" {
		if o.Details != "" {
			return o.Error + ": " + o.Details
		}
		return o.Error
	}
	return string(raw)
}

// Echo round-trips a message: a liveness check of the server.
func (c *Client) Echo(ctx context.Context) error {
	var got []string
	token := "cutover-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := c.Call(ctx, "echo", []any{token}, &got); err != nil {
		return err
	}
	if len(got) != 1 || got[0] != token {
		return fmt.Errorf("ovsdb: echo: sent [%q], got %q", token, got)
	}
	return nil
}

// ListDBs returns the server's database names.
func (c *Client) ListDBs(ctx context.Context) ([]string, error) {
	var dbs []string
	err := c.Call(ctx, "list_dbs", nil, &dbs)
	return dbs, err
}

// Transact runs ops atomically in db. It returns one result per op, or the
// first failed op as an *OpError, or a failed commit as a *TransactError.
//
// If ctx ends first the error wraps ctx.Err(), and the outcome is unknown:
// the server may still commit the transaction (a wait op may be holding it).
func (c *Client) Transact(ctx context.Context, db string, ops ...Operation) ([]OpResult, error) {
	params := make([]any, 0, len(ops)+1)
	params = append(params, db)
	for _, op := range ops {
		params = append(params, op)
	}
	r, err := c.call(ctx, "transact", params)
	if err != nil {
		return nil, err
	}
	if e := rpcErrorText(r.error); e != "" {
		return nil, &TransactError{Err: e}
	}
	return DecodeTransactResult(r.result, ops)
}

// DecodeTransactResult interprets a transact result array for ops
// (RFC 7047 4.1.3): successes, possibly one error object followed by nulls,
// or one trailing extra error when the commit itself failed.
func DecodeTransactResult(raw json.RawMessage, ops []Operation) ([]OpResult, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, &TransactError{Err: "malformed result", Details: err.Error()}
	}
	if len(elems) < len(ops) || len(elems) > len(ops)+1 {
		return nil, &TransactError{Err: "malformed result", Details: fmt.Sprintf("%d results for %d operations", len(elems), len(ops))}
	}
	type elem struct {
		Count   *int            `json:"count"`
		UUID    json.RawMessage `json:"uuid"`
		Rows    []Row           `json:"rows"`
		Error   *string         `json:"error"`
		Details string          `json:"details"`
	}
	results := make([]OpResult, 0, len(ops))
	for i, rawElem := range elems {
		if string(rawElem) == "null" {
			// Not attempted: only legal after a failed op, which returned.
			return nil, &TransactError{Err: "malformed result", Details: fmt.Sprintf("result %d is null with no failed op before it", i)}
		}
		var e elem
		if err := json.Unmarshal(rawElem, &e); err != nil {
			return nil, &TransactError{Err: "malformed result", Details: fmt.Sprintf("result %d: %v", i, err)}
		}
		if e.Error != nil {
			if i == len(ops) {
				return results, &TransactError{Err: *e.Error, Details: e.Details}
			}
			return results, &OpError{Index: i, Op: ops[i].Op, Err: *e.Error, Details: e.Details}
		}
		if i == len(ops) {
			return nil, &TransactError{Err: "malformed result", Details: "extra result element that is not an error"}
		}
		res := OpResult{Rows: e.Rows}
		if e.Count != nil {
			res.Count = *e.Count
		}
		if len(e.UUID) > 0 {
			v, err := DecodeValue(e.UUID)
			u, ok := v.(UUID)
			if err != nil || !ok {
				return nil, &TransactError{Err: "malformed result", Details: fmt.Sprintf("result %d: uuid %s", i, e.UUID)}
			}
			res.UUID = u
		}
		results = append(results, res)
	}
	return results, nil
}
