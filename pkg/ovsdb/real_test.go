package ovsdb_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/ovsproc"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/ovsdb"
)

// startOVS runs a private OVS in a fresh netns and returns a client on it.
func startOVS(t *testing.T) (*ovsproc.Instance, *ovsdb.Client, context.Context) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-appctl")
	ns := testenv.Netns(t, "cot-ovsdb")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	inst, err := ovsproc.Start(ctx, ovsproc.Options{Dir: t.TempDir(), Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	c, err := ovsdb.Dial(ctx, "unix:"+inst.DBSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return inst, c, ctx
}

const db = "Open_vSwitch"

func nextCfg(t *testing.T, ctx context.Context, c *ovsdb.Client) int64 {
	t.Helper()
	res, err := c.Transact(ctx, db, ovsdb.Select("Open_vSwitch", nil, "next_cfg"))
	if err != nil {
		t.Fatal(err)
	}
	n, _, err := ovsdb.AsInt(res[0].Rows[0]["next_cfg"])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRealServer(t *testing.T) {
	inst, c, ctx := startOVS(t)

	if err := c.Echo(ctx); err != nil {
		t.Fatal(err)
	}
	dbs, err := c.ListDBs(ctx)
	if err != nil || !strings.Contains(strings.Join(dbs, ","), db) {
		t.Fatalf("list_dbs = %v, %v", dbs, err)
	}

	t.Run("mutate, comment and select see each other", func(t *testing.T) {
		before := nextCfg(t, ctx, c)
		res, err := c.Transact(ctx, db,
			ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("next_cfg", "+=", 1)),
			ovsdb.Comment("ovsdb test"),
			ovsdb.Select("Open_vSwitch", nil, "next_cfg"))
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Count != 1 {
			t.Fatalf("mutate count = %d", res[0].Count)
		}
		if got, _, _ := ovsdb.AsInt(res[2].Rows[0]["next_cfg"]); got != before+1 {
			t.Fatalf("next_cfg in txn = %d, want %d", got, before+1)
		}
		// Read back independently.
		out, err := inst.Vsctl(ctx, "--no-wait", "get", "Open_vSwitch", ".", "next_cfg")
		if err != nil || strings.TrimSpace(out) != strconv.FormatInt(before+1, 10) {
			t.Fatalf("ovs-vsctl next_cfg = %q, %v; want %d", out, err, before+1)
		}
	})

	t.Run("wait holds and times out", func(t *testing.T) {
		cur := nextCfg(t, ctx, c)
		_, err := c.Transact(ctx, db,
			ovsdb.Wait("Open_vSwitch", nil, []string{"next_cfg"}, "==", []ovsdb.Row{{"next_cfg": cur}}, 0),
			ovsdb.Update("Open_vSwitch", nil, ovsdb.Row{"external_ids": ovsdb.Map{"cas": "1"}}))
		if err != nil {
			t.Fatalf("wait on the current value: %v", err)
		}
		_, err = c.Transact(ctx, db,
			ovsdb.Wait("Open_vSwitch", nil, []string{"next_cfg"}, "==", []ovsdb.Row{{"next_cfg": cur + 100}}, 0),
			ovsdb.Update("Open_vSwitch", nil, ovsdb.Row{"external_ids": ovsdb.Map{"cas": "2"}}))
		if !ovsdb.IsWaitFailed(err) {
			t.Fatalf("wait on a stale value: %v, want IsWaitFailed", err)
		}
		// The update after the failed wait did not happen.
		out, _ := inst.Vsctl(ctx, "--no-wait", "get", "Open_vSwitch", ".", "external_ids:cas")
		if strings.Trim(strings.TrimSpace(out), `"`) != "1" {
			t.Fatalf("external_ids:cas = %q after a failed CAS, want 1", out)
		}
		// A wait with a timeout blocks until another client makes it true.
		done := make(chan error, 1)
		go func() {
			_, err := c.Transact(ctx, db, ovsdb.Wait("Open_vSwitch", nil, []string{"external_ids"}, "==",
				[]ovsdb.Row{{"external_ids": ovsdb.Map{"cas": "3"}}}, 5000))
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		if _, err := inst.Vsctl(ctx, "--no-wait", "set", "Open_vSwitch", ".", "external_ids:cas=3"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("blocked wait: %v", err)
		}
	})

	t.Run("op error names the op", func(t *testing.T) {
		_, err := c.Transact(ctx, db,
			ovsdb.Select("Open_vSwitch", nil),
			ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("no_such_column", "+=", 1)))
		var oe *ovsdb.OpError
		if !errors.As(err, &oe) || oe.Index != 1 || oe.Op != "mutate" {
			t.Fatalf("err = %v, want OpError at 1", err)
		}
	})

	t.Run("commit constraint violation is the trailing error", func(t *testing.T) {
		// Two bridges with one name: every op succeeds, the commit fails on
		// Bridge's name index.
		_, err := c.Transact(ctx, db,
			ovsdb.Insert("Bridge", ovsdb.Row{"name": "dup"}, "b1"),
			ovsdb.Insert("Bridge", ovsdb.Row{"name": "dup"}, "b2"),
			ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("bridges", "insert", ovsdb.Set{ovsdb.NamedUUID("b1"), ovsdb.NamedUUID("b2")})))
		var te *ovsdb.TransactError
		if !errors.As(err, &te) || !ovsdb.IsConstraintViolation(err) {
			t.Fatalf("err = %#v (%v), want TransactError constraint violation", err, err)
		}
	})

	t.Run("referential integrity", func(t *testing.T) {
		_, err := c.Transact(ctx, db, ovsdb.Mutate("Open_vSwitch", nil,
			ovsdb.Mut("bridges", "insert", ovsdb.Set{ovsdb.UUID("00000000-0000-0000-0000-000000000001")})))
		if !ovsdb.IsReferentialIntegrityViolation(err) {
			t.Fatalf("err = %v, want referential integrity violation", err)
		}
	})

	t.Run("unknown database", func(t *testing.T) {
		_, err := c.Transact(ctx, "Nope", ovsdb.Comment("x"))
		var te *ovsdb.TransactError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "unknown database") {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("monitor sees vswitchd advance cur_cfg", func(t *testing.T) {
		mon, err := c.Monitor(ctx, db, map[string]ovsdb.MonitorRequest{"Open_vSwitch": {Columns: []string{"cur_cfg"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mon.Cancel(ctx) }()
		var start int64
		for _, ru := range mon.Initial["Open_vSwitch"] {
			start, _, _ = ovsdb.AsInt(ru.New["cur_cfg"])
		}
		if _, err := c.Transact(ctx, db, ovsdb.Mutate("Open_vSwitch", nil, ovsdb.Mut("next_cfg", "+=", 1))); err != nil {
			t.Fatal(err)
		}
		want := nextCfg(t, ctx, c)
		for got := start; got < want; {
			u, err := mon.Next(ctx)
			if err != nil {
				t.Fatalf("waiting for cur_cfg %d (at %d): %v", want, got, err)
			}
			for _, ru := range u["Open_vSwitch"] {
				got, _, _ = ovsdb.AsInt(ru.New["cur_cfg"])
			}
		}
	})

	t.Run("concurrent callers", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := 0; i < 20; i++ {
			wg.Add(2)
			go func() { defer wg.Done(); errs <- c.Echo(ctx) }()
			go func() {
				defer wg.Done()
				_, err := c.Transact(ctx, db, ovsdb.Select("Open_vSwitch", nil, "cur_cfg"))
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("tcp", func(t *testing.T) {
		// ovsdb-server runs in the test's netns: its loopback listener is
		// reachable only from there, so dial from inside it.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close() // a free port number; the netns has its own ports anyway
		ctl := filepath.Join(inst.Dir, "ovsdb-server.ctl")
		if out, err := inst.Command(ctx, "ovs-appctl", "-t", ctl, "ovsdb-server/add-remote",
			"ptcp:"+strconv.Itoa(port)+":127.0.0.1").CombinedOutput(); err != nil {
			t.Fatalf("add-remote: %v: %s", err, out)
		}
		var tc *ovsdb.Client
		addr := "tcp:127.0.0.1:" + strconv.Itoa(port)
		deadline := time.Now().Add(5 * time.Second)
		for {
			err = netns.Do(inst.Netns, func() error {
				var err error
				tc, err = ovsdb.Dial(ctx, addr)
				return err
			})
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		if err := tc.Echo(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.Transact(ctx, db, ovsdb.Select("Open_vSwitch", nil, "cur_cfg")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("server gone", func(t *testing.T) {
		if err := inst.Stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("client did not notice the server's exit")
		}
		if err := c.Echo(ctx); !ovsdb.IsClosed(err) {
			t.Fatalf("echo after server exit: %v, want closed", err)
		}
	})
}
