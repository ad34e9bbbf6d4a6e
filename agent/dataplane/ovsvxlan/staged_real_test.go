package ovsvxlan

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/openflow"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
)

// stagedRig is realRig with what the staged strategy needs: OpenFlow
// access, the node IP to bind the receive port to, br0's MTU
// pinned, and owner's flows in the shape of OpenShift SDN's: what arrives
// on vxlan0 (ofport 1) goes through table 0 to table 10, which matches
// in_port again and delivers to br0; anything else is dropped.
func newStagedRig(ctx context.Context, t *testing.T) (realRig, *countingOF) {
	t.Helper()
	r := newRealRig(ctx, t)
	of := &countingOF{Interface: &openflow.Client{RunDir: r.inst.Dir}}
	r.b.cfg.OF = of
	r.b.cfg.RxLocalIP = netip.MustParseAddr("198.18.0.11")
	if _, err := r.inst.Vsctl(ctx, "set", "interface", "br0", "mtu_request=1450"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{
		"table=0,priority=200,in_port=1,actions=resubmit(,10)",
		"table=0,priority=0,actions=drop",
		"table=10,priority=100,in_port=1,tun_src=198.18.0.12,actions=LOCAL",
		"table=10,priority=0,actions=drop",
	} {
		if _, err := r.inst.Ofctl(ctx, "add-flow", "br0", f); err != nil {
			t.Fatal(err)
		}
	}
	return r, of
}

// countingOF counts the flow table changes the backend asks for: on a
// userspace datapath each one stalls the node's forwarding for a while
// (docs/staged.md), so how many a phase makes is part of its contract.
type countingOF struct {
	openflow.Interface
	writes int
}

func (c *countingOF) AddFlow(ctx context.Context, bridge string, f openflow.Flow) error {
	c.writes++
	return c.Interface.AddFlow(ctx, bridge, f)
}

func (c *countingOF) AddFlows(ctx context.Context, bridge string, flows []openflow.Flow) error {
	c.writes++
	return c.Interface.AddFlows(ctx, bridge, flows)
}

func (c *countingOF) DelFlows(ctx context.Context, bridge string, match openflow.Flow) error {
	c.writes++
	return c.Interface.DelFlows(ctx, bridge, match)
}

func (c *countingOF) DelFlowStrict(ctx context.Context, bridge string, f openflow.Flow) error {
	c.writes++
	return c.Interface.DelFlowStrict(ctx, bridge, f)
}

var datapathActions = regexp.MustCompile(`(?m)^Datapath actions: (.*)$`)

// trace is what ovs-vswitchd would do with a VXLAN frame from
// 198.18.0.12 arriving on port (a name).
func (r realRig) trace(ctx context.Context, t *testing.T, port string) string {
	t.Helper()
	out, err := r.inst.Appctl(ctx, "ofproto/trace", "br0",
		"in_port="+port+",tun_id=0x5,tun_src=198.18.0.12,tun_dst=198.18.0.11,ip,nw_src=10.128.2.5,nw_dst=10.128.1.7")
	if err != nil {
		t.Fatalf("trace %s: %v\n%s", port, err, out)
	}
	m := datapathActions.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("trace %s: no datapath actions in\n%s", port, out)
	}
	return m[1]
}

// tunnels is where the two tunnels are, read with ovs-vsctl, and the UDP
// ports ovs-vswitchd's userspace tunnel code listens on.
func (r realRig) tunnels(ctx context.Context, t *testing.T) (string, string) {
	t.Helper()
	out, err := r.inst.Vsctl(ctx, "--format=csv", "--no-headings", "--columns=name,options", "find", "interface", "type=vxlan")
	if err != nil {
		t.Fatal(err)
	}
	var ifs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		name, opts, _ := strings.Cut(l, ",")
		port := regexp.MustCompile(`dst_port="*(\d+)`).FindStringSubmatch(opts)
		bound := ""
		if strings.Contains(opts, "local_ip") {
			bound = " bound"
		}
		if port != nil {
			ifs = append(ifs, fmt.Sprintf("%s:%s%s", name, port[1], bound))
		}
	}
	show, err := r.inst.Appctl(ctx, "tnl/ports/show")
	if err != nil {
		t.Fatal(err)
	}
	listening := regexp.MustCompile(`vxlan_sys_(\d+)`).FindAllStringSubmatch(show, -1)
	var ls []string
	for _, m := range listening {
		ls = append(ls, m[1])
	}
	slices.Sort(ifs)
	slices.Sort(ls)
	return strings.Join(ifs, " "), strings.Join(ls, " ")
}

// ours is the staged strategy's flows on br0, as ovs-ofctl prints them.
func (r realRig) ours(ctx context.Context, t *testing.T) []string {
	t.Helper()
	out, err := r.inst.Ofctl(ctx, "dump-flows", "br0", fmt.Sprintf("cookie=%#x/-1", CookieIn))
	if err != nil {
		t.Fatal(err)
	}
	var fl []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "cookie=") {
			fl = append(fl, strings.TrimSpace(l))
		}
	}
	return fl
}

// stepper returns a check of one staged step: fn runs in the rig's
// namespace and makes exactly writes flow table changes, after it the VXLAN
// interfaces are ifs and OVS listens on listening (rig.tunnels), nOurs flows
// of ours are on br0, and a frame on every receive port and on vxlan0 gets
// want, vxlan0's datapath actions before any change.
func (r realRig) stepper(ctx context.Context, t *testing.T, of *countingOF, want string) func(what string, fn func() error, ifs, listening string, nOurs, writes int) {
	rx := RxName("vxlan0")
	return func(what string, fn func() error, ifs, listening string, nOurs, writes int) {
		t.Helper()
		before := of.writes
		r.in(fn)
		if got := of.writes - before; got != writes {
			t.Fatalf("%s: %d flow table changes, want %d", what, got, writes)
		}
		gotIfs, gotL := r.tunnels(ctx, t)
		if gotIfs != ifs || gotL != listening {
			t.Fatalf("after %s: tunnels %q listening on %q, want %q on %q", what, gotIfs, gotL, ifs, listening)
		}
		if got := r.ours(ctx, t); len(got) != nOurs {
			t.Fatalf("after %s: %d flows of ours, want %d: %q", what, len(got), nOurs, got)
		}
		for _, p := range []string{rx, rxOld("vxlan0")} {
			if !strings.Contains(ifs, p+":") {
				continue
			}
			if got := r.trace(ctx, t, p); got != want {
				t.Fatalf("after %s: a frame on %s: datapath actions %q, on vxlan0 %q", what, p, got, want)
			}
		}
		if got := r.trace(ctx, t, "vxlan0"); got != want {
			t.Fatalf("after %s: a frame on vxlan0: datapath actions %q, want %q as before", what, got, want)
		}
	}
}

// TestRealStagedPhases drives the OVS staged phases against a real
// ovsdb-server + ovs-vswitchd: what arrives on each receive port is handled
// exactly as what arrives on vxlan0 (ofproto/trace, the owner's flows
// untouched), every tunnel stays registered through the switch (ovs-vsctl
// and tnl/ports/show), a node's change makes two flow table changes (the
// listen's, the retirement's) and none at the switch or its undo, which are
// port changes, a lost or stale flow comes back with a second Listen, and
// the retirement and the full undo leave one tunnel and none of our flows.
func TestRealStagedPhases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, of := newStagedRig(ctx, t)
	b, rx := r.b, RxName("vxlan0")

	var snap dataplane.Snapshot
	r.in(func() error {
		if p := b.StagedProblems(ctx, 4889); len(p) > 0 {
			t.Fatalf("staged problems on a clean rig: %q", p)
		}
		var err error
		snap, err = b.Snapshot(ctx, 4789, 4889)
		return err
	})
	want := r.trace(ctx, t, "vxlan0")
	if want == "drop" {
		t.Fatalf("the owner's flows drop vxlan0's frame: the rig is wrong")
	}
	step := r.stepper(ctx, t, of, want)
	listen := func() error { return b.Listen(ctx, snap) }
	sw := func(port tunnelport.Port, fn func(context.Context, dataplane.Snapshot) (dataplane.State, error)) func() error {
		return func() error {
			st, err := fn(ctx, snap)
			if err == nil && (st.Port != port || st.Detail["send_port"] != fmt.Sprint(port)) {
				t.Fatalf("send port read back %+v, want %d", st, port)
			}
			return err
		}
	}
	step("listen", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 1)
	if got := r.rules(); got != "4889 4789" {
		t.Fatalf("after listen: rules %q, want both ports open", got)
	}
	step("listen again", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)

	// The flow gone (a rebooted node's flow table): the receive port's
	// frames are the owner's default drop, which the trace compare sees;
	// Listen puts it back.
	if _, err := r.inst.Ofctl(ctx, "del-flows", "br0", fmt.Sprintf("cookie=%#x/-1", CookieIn)); err != nil {
		t.Fatal(err)
	}
	if got := r.trace(ctx, t, rx); got == want {
		t.Fatalf("without the redirect a frame on %s still got %q: the trace compare cannot fail", rx, got)
	}
	r.in(func() error {
		if _, err := b.SwitchSend(ctx, snap); err == nil || !strings.Contains(err.Error(), "listen first") {
			t.Fatalf("switch without the flow: %v, want a refusal", err)
		}
		return nil
	})
	step("listen after the flow was lost", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 1)
	// A redirect to another ofport (vxlan0 recreated since) is stale:
	// Listen replaces it.
	rxOFP, err := r.inst.Vsctl(ctx, "get", "interface", rx, "ofport")
	if err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("table=0,priority=65535,cookie=%#x,in_port=%s,actions=load:0x7->NXM_OF_IN_PORT[],resubmit(,0)", CookieIn, strings.TrimSpace(rxOFP))
	if _, err := r.inst.Ofctl(ctx, "add-flow", "br0", stale); err != nil {
		t.Fatal(err)
	}
	if got := r.trace(ctx, t, rx); got == want {
		t.Fatalf("with a stale redirect a frame on %s still got %q: the trace compare cannot fail", rx, got)
	}
	step("listen after the flow went stale", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 2)
	// A redirect for a number no receive port has (another port may get
	// it and would have its frames taken): Listen removes it.
	foreign := fmt.Sprintf("table=0,priority=65535,cookie=%#x,in_port=100,actions=load:0x1->NXM_OF_IN_PORT[],resubmit(,0)", CookieIn)
	if _, err := r.inst.Ofctl(ctx, "add-flow", "br0", foreign); err != nil {
		t.Fatal(err)
	}
	step("listen with a foreign redirect", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 2)

	// The old port's receiver's OpenFlow port taken meanwhile: the switch
	// refuses before vxlan0 moves.
	if _, err := r.inst.Vsctl(ctx, "add-port", "br0", "squat", "--", "set", "interface", "squat", "type=internal",
		fmt.Sprintf("ofport_request=%d", mustInt(t, strings.TrimSpace(rxOFP))+1)); err != nil {
		t.Fatal(err)
	}
	step("switch with the old receiver's port taken", func() error {
		if _, err := b.SwitchSend(ctx, snap); err == nil || !strings.Contains(err.Error(), "is taken by another interface") {
			t.Fatalf("switch: %v, want a refusal naming the taken OpenFlow port", err)
		}
		return nil
	}, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)
	if _, err := r.inst.Vsctl(ctx, "del-port", "br0", "squat"); err != nil {
		t.Fatal(err)
	}
	step("switch", sw(4889, b.SwitchSend), "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("switch again (replay)", sw(4889, b.SwitchSend), "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("listen while switched (a restart)", listen, "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("switch back", sw(4789, b.UnswitchSend), "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)
	step("switch back again", sw(4789, b.UnswitchSend), "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)

	// The full undo from a switched node: swapped back, then gone.
	step("switch", sw(4889, b.SwitchSend), "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("unlisten", func() error { return b.Unlisten(ctx, snap) }, "vxlan0:4789", "4789", 0, 1)
	if got := r.rules(); got != "4789" {
		t.Fatalf("after unlisten: rules %q, want only the old port", got)
	}

	// To the end: listen, switch, retire (twice: a replay).
	step("listen", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 1)
	step("switch", sw(4889, b.SwitchSend), "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	for _, what := range []string{"retire", "retire again"} {
		step(what, func() error {
			st, err := b.Retire(ctx, snap)
			if err == nil && st.Port != 4889 {
				t.Fatalf("retire read back %+v, want port 4889", st)
			}
			return err
		}, "vxlan0:4889", "4889", 0, map[string]int{"retire": 1, "retire again": 0}[what])
	}
	if got := r.rules(); got != "4889" {
		t.Fatalf("after retire: rules %q, want only the new port", got)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ourPorts is the OpenFlow port numbers our flows on br0 match.
func (r realRig) ourPorts(ctx context.Context, t *testing.T) []string {
	t.Helper()
	var ports []string
	for _, f := range r.ours(ctx, t) {
		if m := regexp.MustCompile(`in_port=(\d+)`).FindStringSubmatch(f); m != nil {
			ports = append(ports, m[1])
		}
	}
	slices.Sort(ports)
	return ports
}

// TestRealStandingRedirects runs the staged phases with standing redirects
// (--ovs-standing-redirects) against a real ovsdb-server + ovs-vswitchd:
// Keep installs the two flows once, after which a whole staged change
// (listen, switch, retire) and an undone one make no flow table change at
// all, every frame is handled as without them, and the flows stay, dormant,
// after each. Keep puts back flows an OVS restart lost and moves them off a
// number another interface took (they would hand its frames to vxlan0's
// flows).
func TestRealStandingRedirects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, of := newStagedRig(ctx, t)
	b := r.b
	b.cfg.StandingRedirects = true

	var snap dataplane.Snapshot
	r.in(func() error {
		var err error
		snap, err = b.Snapshot(ctx, 4789, 4889)
		return err
	})
	want := r.trace(ctx, t, "vxlan0")
	step := r.stepper(ctx, t, of, want)
	keep := func(changed bool) func() error {
		return func() error {
			got, err := b.Keep(ctx)
			if err == nil && got != changed {
				t.Fatalf("Keep: changed %v, want %v", got, changed)
			}
			return err
		}
	}
	step("keep on a clean bridge", keep(true), "vxlan0:4789", "4789", 2, 1)
	standing := r.ourPorts(ctx, t)
	step("keep again", keep(false), "vxlan0:4789", "4789", 2, 0)
	r.in(func() error {
		if p := b.StagedProblems(ctx, 4889); len(p) > 0 {
			t.Fatalf("staged problems with the standing redirects in place: %q", p)
		}
		return nil
	})

	listen := func() error { return b.Listen(ctx, snap) }
	sw := func() error { _, err := b.SwitchSend(ctx, snap); return err }
	retire := func() error { _, err := b.Retire(ctx, snap); return err }
	step("listen", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)
	if got := r.ourPorts(ctx, t); !slices.Equal(got, standing) {
		t.Fatalf("after listen our flows match ports %q, want the standing ones %q", got, standing)
	}
	step("keep while listening", keep(false), "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)
	step("switch", sw, "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("unlisten", func() error { return b.Unlisten(ctx, snap) }, "vxlan0:4789", "4789", 2, 0)
	step("listen", listen, "vxlan0-cot:4889 bound vxlan0:4789", "4789 4889", 2, 0)
	step("switch", sw, "vxlan0-cot-old:4789 bound vxlan0-cot:4889 bound vxlan0:4889", "4789 4889", 2, 0)
	step("retire", retire, "vxlan0:4889", "4889", 2, 0)
	step("keep after the retirement", keep(false), "vxlan0:4889", "4889", 2, 0)
	if got := r.ourPorts(ctx, t); !slices.Equal(got, standing) {
		t.Fatalf("after the retirement our flows match ports %q, want the standing ones %q", got, standing)
	}

	// An OVS restart loses the flow table: Keep puts them back.
	if _, err := r.inst.Ofctl(ctx, "del-flows", "br0", fmt.Sprintf("cookie=%#x/-1", CookieIn)); err != nil {
		t.Fatal(err)
	}
	step("keep after the flows were lost", keep(true), "vxlan0:4889", "4889", 2, 1)

	// Another interface asks for one of their numbers: Keep moves them
	// off it, so its frames are not handed to vxlan0's flows.
	if _, err := r.inst.Vsctl(ctx, "add-port", "br0", "squat", "--", "set", "interface", "squat", "type=internal",
		"mtu_request=1450", "ofport_request="+standing[1]); err != nil {
		t.Fatal(err)
	}
	step("keep with a number taken", keep(true), "vxlan0:4889", "4889", 2, 2)
	moved := r.ourPorts(ctx, t)
	if len(moved) != 2 || slices.Contains(moved, standing[1]) {
		t.Fatalf("our flows match ports %q, want two, none the number %s the interface took", moved, standing[1])
	}
	step("keep again", keep(false), "vxlan0:4889", "4889", 2, 0)
}
