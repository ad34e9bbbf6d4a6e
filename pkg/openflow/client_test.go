package openflow

import (
	"context"
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

type call struct {
	argv, env []string
}

// seam records calls and answers with out/err.
func seam(calls *[]call, out string, err error) execseam.Func {
	return func(_ context.Context, argv, env []string) ([]byte, error) {
		*calls = append(*calls, call{argv, env})
		return []byte(out), err
	}
}

func mustParse(t *testing.T, s string) Flow {
	t.Helper()
	f, err := ParseFlow(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestClientArgv(t *testing.T) {
	ctx := context.Background()
	var calls []call
	c := &Client{Exec: seam(&calls, "", nil), RunDir: "/tmp/ovs1"}
	drop := mustParse(t, "table=0,priority=200,udp,udp_dst=4789,actions=drop")
	if err := c.AddFlow(ctx, "br0", drop); err != nil {
		t.Fatal(err)
	}
	if err := c.DelFlows(ctx, "br0", Flow{Cookie: 0x12, Match: []Field{{"udp", ""}, {"udp_dst", "4789"}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.DelFlowStrict(ctx, "br0", drop); err != nil {
		t.Fatal(err)
	}
	c.Netns = "cot-x"
	if _, err := c.DumpFlows(ctx, "br0"); err != nil {
		t.Fatal(err)
	}
	pre := "ovs-ofctl -O OpenFlow13 --timeout=10 "
	want := []string{
		pre + "add-flow br0 table=0,priority=200,udp,udp_dst=4789,actions=drop",
		pre + "del-flows br0 table=0,cookie=0x12/-1,udp,udp_dst=4789",
		pre + "--strict del-flows br0 table=0,priority=200,udp,udp_dst=4789",
		"ip netns exec cot-x " + pre + "--no-names dump-flows br0",
	}
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d", len(calls), len(want))
	}
	for i, c := range calls {
		if got := strings.Join(c.argv, " "); got != want[i] {
			t.Errorf("call %d: %q\nwant     %q", i, got, want[i])
		}
		if !reflect.DeepEqual(c.env, []string{"OVS_RUNDIR=/tmp/ovs1"}) {
			t.Errorf("call %d env = %q", i, c.env)
		}
	}
}

func TestClientRefusesBeforeExec(t *testing.T) {
	ctx := context.Background()
	var calls []call
	c := &Client{Exec: seam(&calls, "", nil)}
	for name, err := range map[string]error{
		"empty match": c.DelFlows(ctx, "br0", Flow{Table: 3}),
		"bad bridge":  c.AddFlow(ctx, "br 0", Flow{Priority: 1, Actions: "drop"}),
		"no actions":  c.AddFlow(ctx, "br0", Flow{Priority: 1}),
		"no prereq":   c.DelFlows(ctx, "br0", Flow{Match: []Field{{"udp_dst", "4789"}}}),
	} {
		if !IsValidation(err) {
			t.Errorf("%s: %v, want a validation error", name, err)
		}
	}
	if err := c.DelFlows(ctx, "br0", Flow{Table: 3}); !strings.Contains(err.Error(), "every flow in table 3") {
		t.Errorf("empty match error does not say why: %v", err)
	}
	if len(calls) != 0 {
		t.Fatalf("bad input reached exec: %v", calls)
	}
}

func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	var calls []call
	exitErr := &exec.ExitError{}
	c := &Client{Exec: seam(&calls, "ovs-ofctl: br9 is not a bridge or a socket\n", exitErr)}
	_, err := c.DumpFlows(ctx, "br9")
	var e *execseam.Error
	if !errors.As(err, &e) || !IsNotFound(err) || !errors.Is(err, exitErr) {
		t.Fatalf("err = %#v; want *Error, IsNotFound, wrapping the exit error", err)
	}
	if !strings.Contains(err.Error(), "ovs-ofctl -O OpenFlow13") || !strings.Contains(err.Error(), "is not a bridge") {
		t.Fatalf("error lacks argv or output: %v", err)
	}
	c.Exec = seam(&calls, "ovs-ofctl: unknown keyword foo\n", exitErr)
	err = c.AddFlow(ctx, "br0", Flow{Priority: 1, Match: []Field{{"foo", "1"}}, Actions: "drop"})
	if err == nil || IsNotFound(err) || !strings.Contains(err.Error(), "unknown keyword foo") {
		t.Fatalf("err = %v", err)
	}
	// Unparseable dump output is an error naming the line, not a silent skip.
	c.Exec = seam(&calls, "OFPST_FLOW reply (OF1.3) (xid=0x2):\n cookie=0x0, table=0, priority=1 garbage\n", nil)
	if _, err := c.DumpFlows(ctx, "br0"); err == nil || !strings.Contains(err.Error(), "garbage") {
		t.Fatalf("err = %v", err)
	}
}

func TestClientDumpParses(t *testing.T) {
	out := `OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x0, duration=0.076s, table=0, n_packets=0, n_bytes=0, in_port=1 actions=goto_table:10
 cookie=0x0, duration=0.101s, table=0, n_packets=0, n_bytes=0, priority=200,udp,tp_dst=4789 actions=drop
 cookie=0x0, duration=0.130s, table=0, n_packets=0, n_bytes=0, priority=0 actions=NORMAL
OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x1234, duration=0.007s, table=20, n_packets=0, n_bytes=0, priority=5,reg0=0x1,dl_dst=00:11:22:33:44:55 actions=load:0x2->NXM_NX_REG1[],resubmit(,30)
`
	var calls []call
	c := &Client{Exec: seam(&calls, out, nil)}
	flows, err := c.DumpFlows(context.Background(), "br0")
	if err != nil {
		t.Fatal(err)
	}
	want := `cookie=0x0, table=0, priority=32768,in_port=1 actions=goto_table:10
cookie=0x0, table=0, priority=200,udp,tp_dst=4789 actions=drop
cookie=0x0, table=0, priority=0 actions=NORMAL
cookie=0x1234, table=20, priority=5,reg0=0x1,dl_dst=00:11:22:33:44:55 actions=load:0x2->NXM_NX_REG1[],resubmit(,30)
`
	if got := CanonicalDump(flows); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}
