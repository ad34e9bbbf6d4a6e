package ovsdb

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer is the far end of a net.Pipe speaking raw JSON-RPC, so tests
// control exactly what the client reads (order, errors, garbage).
type fakeServer struct {
	t    *testing.T
	conn net.Conn
	dec  *json.Decoder
	wmu  sync.Mutex
}

func newPair(t *testing.T) (*Client, *fakeServer) {
	t.Helper()
	a, b := net.Pipe()
	c := NewClient(a)
	t.Cleanup(func() { _ = c.Close(); _ = b.Close() })
	return c, &fakeServer{t: t, conn: b, dec: json.NewDecoder(b)}
}

func (s *fakeServer) read() message {
	var m message
	if err := s.dec.Decode(&m); err != nil {
		s.t.Errorf("fake server read: %v", err)
	}
	return m
}

func (s *fakeServer) send(raw string) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.conn.Write([]byte(raw)); err != nil {
		s.t.Errorf("fake server write: %v", err)
	}
}

func (s *fakeServer) reply(m message, result string) {
	s.send(`{"id":` + string(m.ID) + `,"error":null,"result":` + result + `}`)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestConcurrentCallsOutOfOrder(t *testing.T) {
	c, s := newPair(t)
	ctx := ctxT(t)
	const n = 8
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- c.Echo(ctx) }()
	}
	var reqs []message
	for i := 0; i < n; i++ {
		reqs = append(reqs, s.read())
	}
	// Answer in reverse order: each caller must get its own answer.
	for i := n - 1; i >= 0; i-- {
		if reqs[i].Method != "echo" {
			t.Fatalf("method %q, want echo", reqs[i].Method)
		}
		s.reply(reqs[i], string(reqs[i].Params))
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestAnswersServerEcho(t *testing.T) {
	_, s := newPair(t)
	s.send(`{"method":"echo","params":["probe",1],"id":"echo"}`)
	m := s.read()
	if string(m.ID) != `"echo"` || string(m.Result) != `["probe",1]` || string(m.Error) != "null" {
		t.Fatalf("echo reply = id %s result %s error %s", m.ID, m.Result, m.Error)
	}
}

func TestTransactErrors(t *testing.T) {
	ops := []Operation{
		Wait("Interface", nil, []string{"options"}, "==", []Row{{"options": Map{}}}, 0),
		Update("Interface", nil, Row{"options": Map{}}),
		Mutate("Open_vSwitch", nil, Mut("next_cfg", "+=", 1)),
	}
	for _, tc := range []struct {
		name, result string
		check        func(t *testing.T, res []OpResult, err error)
	}{
		{"ok", `[{},{"count":1},{"count":1}]`, func(t *testing.T, res []OpResult, err error) {
			if err != nil || len(res) != 3 || res[1].Count != 1 {
				t.Fatalf("res %+v err %v", res, err)
			}
		}},
		{"wait timed out", `[{"error":"timed out"},null,null]`, func(t *testing.T, res []OpResult, err error) {
			var oe *OpError
			if !errors.As(err, &oe) || oe.Index != 0 || oe.Op != "wait" || !IsWaitFailed(err) {
				t.Fatalf("err = %v, want OpError on wait 0", err)
			}
			if IsConstraintViolation(err) || len(res) != 0 {
				t.Fatalf("res %v; constraint=%v", res, IsConstraintViolation(err))
			}
		}},
		{"op 2 fails", `[{},{"count":1},{"error":"constraint violation","details":"next_cfg overflow"}]`, func(t *testing.T, res []OpResult, err error) {
			var oe *OpError
			if !errors.As(err, &oe) || oe.Index != 2 || oe.Op != "mutate" || !IsConstraintViolation(err) || IsWaitFailed(err) {
				t.Fatalf("err = %v", err)
			}
			if !strings.Contains(err.Error(), "next_cfg overflow") || len(res) != 2 {
				t.Fatalf("err %q res %v", err, res)
			}
		}},
		{"commit fails", `[{},{"count":1},{"count":1},{"error":"referential integrity violation","details":"dangling"}]`, func(t *testing.T, res []OpResult, err error) {
			var te *TransactError
			if !errors.As(err, &te) || !IsReferentialIntegrityViolation(err) || len(res) != 3 {
				t.Fatalf("err = %v res %v", err, res)
			}
		}},
		{"too few", `[{}]`, func(t *testing.T, _ []OpResult, err error) {
			var te *TransactError
			if !errors.As(err, &te) || te.Err != "malformed result" {
				t.Fatalf("err = %v", err)
			}
		}},
		{"null without error", `[{},null,null]`, func(t *testing.T, _ []OpResult, err error) {
			if err == nil || !strings.Contains(err.Error(), "null") {
				t.Fatalf("err = %v", err)
			}
		}},
		{"extra success", `[{},{},{},{}]`, func(t *testing.T, _ []OpResult, err error) {
			if err == nil {
				t.Fatal("no error")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := newPair(t)
			go func() { m := s.read(); s.reply(m, tc.result) }()
			res, err := c.Transact(ctxT(t), "Open_vSwitch", ops...)
			tc.check(t, res, err)
		})
	}
}

func TestTransactRPCError(t *testing.T) {
	c, s := newPair(t)
	go func() {
		m := s.read()
		s.send(`{"id":` + string(m.ID) + `,"result":null,"error":{"error":"unknown database","details":"Nope"}}`)
	}()
	_, err := c.Transact(ctxT(t), "Nope", Comment("x"))
	var te *TransactError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "unknown database") {
		t.Fatalf("err = %v", err)
	}
}

func TestDeadlineAndLateAnswer(t *testing.T) {
	c, s := newPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := make(chan message, 1)
	go func() { got <- s.read() }()
	err := c.Echo(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	// The late answer is dropped, and the connection still works.
	s.reply(<-got, `["late"]`)
	go func() { m := s.read(); s.reply(m, string(m.Params)) }()
	if err := c.Echo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

func TestCloseFailsPending(t *testing.T) {
	c, s := newPair(t)
	errc := make(chan error, 1)
	go func() { errc <- c.Echo(context.Background()) }()
	s.read()
	_ = s.conn.Close()
	if err := <-errc; !IsClosed(err) {
		t.Fatalf("pending call after server hangup: %v, want ErrClosed", err)
	}
	<-c.Done()
	if err := c.Echo(context.Background()); !IsClosed(err) {
		t.Fatalf("call on dead client: %v", err)
	}
}

func TestGarbageKillsConnection(t *testing.T) {
	c, s := newPair(t)
	errc := make(chan error, 1)
	go func() { errc <- c.Echo(context.Background()) }()
	s.read()
	s.send(`{"id":"not-ours","result":[],"error":null}`)
	if err := <-errc; !IsClosed(err) || !strings.Contains(err.Error(), "not-ours") {
		t.Fatalf("err = %v", err)
	}
}

func TestMonitorFake(t *testing.T) {
	c, s := newPair(t)
	ctx := ctxT(t)
	go func() {
		m := s.read()
		var p []json.RawMessage
		_ = json.Unmarshal(m.Params, &p)
		s.reply(m, `{"Open_vSwitch":{"`+u1+`":{"new":{"cur_cfg":1}}}}`)
		s.send(`{"id":null,"method":"update","params":[` + string(p[1]) + `,{"Open_vSwitch":{"` + u1 + `":{"old":{"cur_cfg":1},"new":{"cur_cfg":2}}}}]}`)
		s.send(`{"id":null,"method":"update","params":["someone-else",{}]}`)
		m = s.read()
		if m.Method != "monitor_cancel" {
			t.Errorf("method %q, want monitor_cancel", m.Method)
		}
		s.reply(m, `{}`)
	}()
	mon, err := c.Monitor(ctx, "Open_vSwitch", map[string]MonitorRequest{"Open_vSwitch": {Columns: []string{"cur_cfg"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mon.Initial["Open_vSwitch"][UUID(u1)].New["cur_cfg"]; got != int64(1) {
		t.Fatalf("initial cur_cfg = %#v", got)
	}
	u, err := mon.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ru := u["Open_vSwitch"][UUID(u1)]
	if ru.New["cur_cfg"] != int64(2) || ru.Old["cur_cfg"] != int64(1) {
		t.Fatalf("update = %+v", ru)
	}
	if err := mon.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := mon.Next(ctx); err == nil {
		t.Fatal("Next after Cancel succeeded")
	}
}

func TestDialBadAddress(t *testing.T) {
	for _, a := range []string{"", "/tmp/x.sock", "ssl:198.18.0.1:6640", "unix:", "tcp"} {
		if _, err := Dial(context.Background(), a); err == nil || !strings.Contains(err.Error(), "want unix:") {
			t.Errorf("Dial(%q) = %v", a, err)
		}
	}
}
