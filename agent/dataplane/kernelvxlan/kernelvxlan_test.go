package kernelvxlan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/conntrack"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"github.com/cutover-dev/cutover/pkg/udpport"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

const (
	from = 8472
	to   = 4889
)

var allowTemplate = iptables.Rule{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}

// flannelDevice is flannel.1 as flanneld leaves it on a node with one peer.
func flannelDevice(port int) vxlan.Snapshot {
	return vxlan.Snapshot{
		Device: vxlan.Device{Name: "flannel.1", Index: 7, MTU: 1450, MAC: "02:42:c6:12:64:01", TxQLen: 1000, Up: true,
			VNI: 1, Port: port, Local: net.ParseIP("198.18.0.1"), VtepDev: "eth0"},
		Addrs:     []vxlan.Addr{{CIDR: "198.18.64.0/32"}},
		FDB:       []vxlan.FDBEntry{{MAC: "02:42:c6:12:64:02", Dst: net.ParseIP("198.18.0.2"), State: 0x80, Flags: 2}},
		Neighbors: []vxlan.Neighbor{{IP: net.ParseIP("198.18.65.0"), MAC: "02:42:c6:12:64:02", State: 0x80}},
		Routes:    []vxlan.Route{{Dst: "198.18.65.0/24", Gw: net.ParseIP("198.18.65.0"), Family: 2, Table: 254, Protocol: 3, Type: 1, Flags: 4}},
	}
}

type rig struct {
	vx  *vxlan.Fake
	ipt *iptables.Fake
	ct  *conntrack.Fake
	pf  *udpport.Fake
	cfg Config
	b   *Backend
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{vx: vxlan.NewFake(flannelDevice(from)), ipt: iptables.NewFake(iptables.BackendNFT), pf: &udpport.Fake{}}
	r.vx.Others["eth0"] = "veth"
	if err := r.ipt.EnsureChain("filter", "OS_FIREWALL_ALLOW"); err != nil {
		t.Fatal(err)
	}
	rule := allowTemplate
	rule.DPort = from
	if err := r.ipt.EnsureRule(rule); err != nil {
		t.Fatal(err)
	}
	r.ct = &conntrack.Fake{Flows: []conntrack.Flow{
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40000, DstPort: from},
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40001, DstPort: to},
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40002, DstPort: 53},
		{Proto: "tcp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40003, DstPort: from},
	}}
	r.cfg = Config{VXLAN: r.vx, Ports: r.pf, Conntrack: r.ct,
		Firewall: &dataplane.Firewall{IPT: r.ipt, Templates: []iptables.Rule{allowTemplate}}}
	r.restart(t)
	return r
}

// restart replaces the backend by a new one over the same kernel: nothing
// may depend on the old one's memory.
func (r *rig) restart(t *testing.T) {
	t.Helper()
	b, err := New(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.b = b
}

func (r *rig) dump() string {
	return "# vxlan\n" + r.vx.Dump() + "# iptables\n" + r.ipt.Dump() + "# conntrack\n" + r.ct.Dump()
}

// want builds the expected dump: device on port, firewall rules for ports,
// conntrack without the udp entries of the ports gone.
func want(t *testing.T, port int, rules []tunnelport.Port, gone ...tunnelport.Port) string {
	t.Helper()
	w := &rig{vx: vxlan.NewFake(flannelDevice(port)), ipt: iptables.NewFake(iptables.BackendNFT)}
	if err := w.ipt.EnsureChain("filter", "OS_FIREWALL_ALLOW"); err != nil {
		t.Fatal(err)
	}
	for _, p := range rules {
		rule := allowTemplate
		rule.DPort = uint16(p)
		if err := w.ipt.EnsureRule(rule); err != nil {
			t.Fatal(err)
		}
	}
	w.ct = newRigFlows()
	for _, p := range gone {
		if _, err := w.ct.DeleteUDPDstPort(uint16(p)); err != nil {
			t.Fatal(err)
		}
	}
	return w.dump()
}

func newRigFlows() *conntrack.Fake {
	return &conntrack.Fake{Flows: []conntrack.Flow{
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40000, DstPort: from},
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40001, DstPort: to},
		{Proto: "udp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40002, DstPort: 53},
		{Proto: "tcp", Src: "198.18.0.2", Dst: "198.18.0.1", SrcPort: 40003, DstPort: from},
	}}
}

// TestDesiredStatesInAnyOrder walks the legal sequences of an operation in
// random orders, repeats every step (a replay), restarts the backend at
// random points (a new instance that only has the persisted snapshot,
// round-tripped through JSON), and diffs the fakes' dumps against the state
// each step must reach whatever came before it (STYLE.md habit 7).
func TestDesiredStatesInAnyOrder(t *testing.T) {
	ctx := context.Background()
	sequences := [][]string{
		{"prepare", "commit", "finalize"},
		{"prepare", "abort"},
		{"prepare", "commit", "revert"},
		{"prepare", "revert"}, // commit lost: revert must still undo prepare
		{"prepare", "commit", "crash", "revert"},
		{"prepare", "commit", "crash", "commit", "finalize"},
	}
	rnd := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 60; i++ {
		seq := sequences[rnd.IntN(len(sequences))]
		t.Run(fmt.Sprintf("%02d_%s", i, strings.Join(seq, "_")), func(t *testing.T) {
			r := newRig(t)
			snap, err := r.b.Snapshot(ctx, from, to)
			if err != nil {
				t.Fatal(err)
			}
			snap = persist(t, snap)
			committed := false
			for _, step := range seq {
				for rep := 0; rep < 1+rnd.IntN(3); rep++ {
					if rnd.IntN(3) == 0 {
						r.restart(t)
					}
					var want string
					switch step {
					case "prepare":
						err = r.b.Prepare(ctx, snap)
						want = wantState(t, "prepared", committed)
					case "commit":
						var st dataplane.State
						st, err = r.b.Commit(ctx, snap)
						if err == nil && (st.Port != to || st.Detail["vni"] != "1" || st.Detail["window_us"] == "") {
							t.Fatalf("commit state %+v", st)
						}
						if err == nil {
							// The agent runs it once the commit is answered.
							_, err = r.b.AfterCommit(ctx, snap)
						}
						committed = true
						want = wantState(t, "committed", committed)
					case "crash":
						// The agent died inside the window: the device is gone.
						if rep > 0 {
							continue
						}
						r.vx.Delete("flannel.1")
						r.restart(t)
						continue
					case "finalize":
						err = r.b.Finalize(ctx, snap)
						want = wantState(t, "finalized", committed)
					case "abort":
						err = r.b.Abort(ctx, snap)
						want = wantState(t, "aborted", committed)
					case "revert":
						var st dataplane.State
						st, err = r.b.Revert(ctx, snap)
						if err == nil && st.Port != from {
							t.Fatalf("revert state %+v", st)
						}
						want = wantState(t, "reverted", committed)
					}
					if err != nil {
						t.Fatalf("%v: %s (repeat %d): %v", seq, step, rep, err)
					}
					if got := r.dump(); got != want {
						t.Fatalf("%v after %s (repeat %d):\n%s\nwant:\n%s", seq, step, rep, got, want)
					}
				}
			}
		})
	}
}

// wantState is the dump every step must reach. Conntrack: a commit deletes
// the old port's udp entries, a revert after a commit the new port's.
func wantState(t *testing.T, phase string, committed bool) string {
	switch phase {
	case "prepared":
		return want(t, from, []tunnelport.Port{from, to})
	case "committed":
		return want(t, to, []tunnelport.Port{from, to}, from)
	case "finalized":
		return want(t, to, []tunnelport.Port{to}, from)
	case "aborted":
		return want(t, from, []tunnelport.Port{from})
	case "reverted":
		if committed {
			return want(t, from, []tunnelport.Port{from}, from, to)
		}
		return want(t, from, []tunnelport.Port{from})
	}
	t.Fatalf("unknown phase %s", phase)
	return ""
}

// persist round-trips the snapshot through JSON, as the agent's store does.
func persist(t *testing.T, s dataplane.Snapshot) dataplane.Snapshot {
	t.Helper()
	js, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out dataplane.Snapshot
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A target-port rule an operator had installed before Cutover survives an
// abort and a revert.
func TestUndoKeepsPreexistingRule(t *testing.T) {
	ctx := context.Background()
	for _, undo := range []string{"abort", "revert"} {
		r := newRig(t)
		pre := allowTemplate
		pre.DPort = to
		if err := r.ipt.EnsureRule(pre); err != nil {
			t.Fatal(err)
		}
		snap, err := r.b.Snapshot(ctx, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.b.Prepare(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if _, err := r.b.Commit(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if undo == "abort" {
			err = r.b.Abort(ctx, snap)
		} else {
			_, err = r.b.Revert(ctx, snap)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.ipt.Dump(), fmt.Sprintf("--dport %d ", to)) {
			t.Fatalf("%s removed the pre-existing %d rule:\n%s", undo, to, r.ipt.Dump())
		}
	}
}

func TestPreflight(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	before := r.dump()
	c, err := r.b.Preflight(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	if c.CurrentPort != from || !c.TargetFree || len(c.Problems) != 0 {
		t.Fatalf("clean preflight = %+v", c)
	}
	actions := strings.Join(c.Actions, "\n")
	for _, w := range []string{"--dport 4889", "recreate flannel.1 (vxlan id 1", "1 FDB entr", "1 route(s)", "median 0.56 ms",
		"conntrack: delete the UDP entries whose original destination port is 8472", "-D OS_FIREWALL_ALLOW", `"Port": 4889`} {
		if !strings.Contains(actions, w) {
			t.Errorf("actions lack %q:\n%s", w, actions)
		}
	}

	problems := func(c dataplane.Check) string { return strings.Join(c.Problems, "\n") }
	r.pf.Hold(to, udpport.Holder{Kind: "vxlan", Device: "vx9"})
	if c, _ := r.b.Preflight(ctx, to); c.TargetFree || c.TargetHolder != "vxlan device vx9" || !strings.Contains(problems(c), "holds its port even while down") {
		t.Fatalf("held port: %+v", c)
	}
	if c, _ := r.b.Preflight(ctx, from); !strings.Contains(problems(c), "already uses it") {
		t.Fatalf("same port: %+v", c)
	}
	if c, _ := r.b.Preflight(ctx, 0); !strings.Contains(problems(c), "target port 0") {
		t.Fatalf("port 0: %+v", c)
	}
	if r.dump() != before {
		t.Fatalf("preflight changed something:\n%s\nwas:\n%s", r.dump(), before)
	}

	// Missing chain, missing device, wrong link type, flow-based, down.
	r2 := newRig(t)
	r2.cfg.Firewall.Templates = []iptables.Rule{{Table: "filter", Chain: "NOPE", Proto: "udp", Target: "ACCEPT"}}
	if c, _ := r2.b.Preflight(ctx, to); !strings.Contains(problems(c), "chain filter/NOPE does not exist") {
		t.Fatalf("missing chain: %+v", c)
	}
	for _, tc := range []struct {
		dev, want string
		edit      func(*vxlan.Snapshot)
	}{
		{"vx-none", "does not exist on this node", nil},
		{"eth0", `link type is "veth"`, nil},
		{"flannel.1", "flow-based", func(s *vxlan.Snapshot) { s.Device.FlowBased = true }},
		{"flannel.1", "is down", func(s *vxlan.Snapshot) { s.Device.Up = false }},
	} {
		r := newRig(t)
		if tc.edit != nil {
			s := flannelDevice(from)
			tc.edit(&s)
			r.vx = vxlan.NewFake(s)
			r.cfg.VXLAN = r.vx
		}
		r.cfg.Device = tc.dev
		r.vx.Others["eth0"] = "veth"
		r.restart(t)
		c, err := r.b.Preflight(ctx, to)
		if err != nil || !strings.Contains(problems(c), tc.want) {
			t.Fatalf("%s: preflight = %+v, %v; want a problem with %q", tc.dev, c, err, tc.want)
		}
		// A device that cannot be read is no port to drift from, and the
		// target port is still checked, not left "not free" by default.
		if tc.edit == nil && (c.CurrentPort != 0 || !c.TargetFree) {
			t.Fatalf("%s: preflight = %+v; want current port 0 (unknown) and the target free", tc.dev, c)
		}
		// Read and Ready say it in the same words, so it is said once.
		if tc.edit == nil {
			_, rerr := r.b.Read(ctx)
			if rerr == nil || rerr.Error() != c.Problems[0] {
				t.Fatalf("%s: Read = %v, want %q", tc.dev, rerr, c.Problems[0])
			}
			if nr := r.b.Ready(ctx); len(nr) != 1 || nr[0] != c.Problems[0] {
				t.Fatalf("%s: Ready = %q, want [%q]", tc.dev, nr, c.Problems[0])
			}
		}
	}
}

func TestSnapshotRefusesWrongFrom(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	for _, tc := range []struct {
		from, to tunnelport.Port
		want     string
	}{
		{4000, to, "current port is 8472, not 4000"},
		{from, from, "need two different"},
		{from, 0, "need two different"},
	} {
		if _, err := r.b.Snapshot(ctx, tc.from, tc.to); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Snapshot(%d, %d) = %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
	r.cfg.Device = "vx-none"
	r.restart(t)
	if _, err := r.b.Snapshot(ctx, from, to); !vxlan.IsNotFound(err) {
		t.Fatalf("missing device: %v, want IsNotFound", err)
	}
}

// Someone else moves the device to a third port: neither Commit nor Revert
// touches it.
func TestDriftIsNotTouched(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap := r.prepared(t)
	if _, err := r.vx.Recreate(flannelDevice(from), 5000); err != nil {
		t.Fatal(err)
	}
	before := r.vx.Dump()
	if _, err := r.b.Commit(ctx, snap); err == nil || !strings.Contains(err.Error(), "neither 8472 nor 4889") {
		t.Fatalf("commit over drift: %v", err)
	}
	st, err := r.b.Revert(ctx, snap)
	if err == nil || !strings.Contains(err.Error(), "neither 4889 nor 8472") || st.Port != 5000 {
		t.Fatalf("revert over drift: %+v, %v", st, err)
	}
	if r.vx.Dump() != before {
		t.Fatalf("drifted device touched:\n%s", r.vx.Dump())
	}
	if err := r.b.Finalize(ctx, snap); err == nil || !strings.Contains(err.Error(), "not closing port 8472") {
		t.Fatalf("finalize with the device on 5000: %v", err)
	}
}

// The CNI adds a peer between Prepare and Commit: the commit keeps it. The
// CNI changes the device itself (MTU): the commit refuses.
func TestCommitUsesFreshEntriesAndRefusesChangedDevice(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap, err := r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	grown := flannelDevice(from)
	grown.FDB = append(grown.FDB, vxlan.FDBEntry{MAC: "02:42:c6:12:64:03", Dst: net.ParseIP("198.18.0.3"), State: 0x80, Flags: 2})
	if _, err := r.vx.Recreate(grown, from); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Commit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.vx.Dump(), "dst 198.18.0.3") {
		t.Fatalf("the peer added after the snapshot was lost:\n%s", r.vx.Dump())
	}

	r = newRig(t)
	snap, err = r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	changed := flannelDevice(from)
	changed.Device.MTU = 1400
	if _, err := r.vx.Recreate(changed, from); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Commit(ctx, snap); err == nil || !strings.Contains(err.Error(), "changed since the snapshot") || !strings.Contains(err.Error(), "mtu 1450") {
		t.Fatalf("commit over a changed device: %v", err)
	}
	if !strings.Contains(r.vx.Dump(), "dstport 8472") {
		t.Fatal("changed device was recreated")
	}
}

// Armed ahead of the instant: a commit with nothing changed since uses the
// early read; one where the CNI added a peer in between reads afresh and
// keeps the peer; one where the device itself changed still refuses; an
// Abort drops what was armed.
func TestArmedCommit(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap := r.prepared(t)
	if err := r.b.ArmCommit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	st, err := r.b.Commit(ctx, snap)
	if err != nil || !strings.HasPrefix(st.Detail["armed"], "used") || st.Port != to {
		t.Fatalf("commit, nothing changed since it was armed: %+v, %v; want the early read used", st, err)
	}

	r = newRig(t)
	snap, _ = r.b.Snapshot(ctx, from, to)
	if err := r.b.ArmCommit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	grown := flannelDevice(from)
	grown.FDB = append(grown.FDB, vxlan.FDBEntry{MAC: "02:42:c6:12:64:03", Dst: net.ParseIP("198.18.0.3"), State: 0x80, Flags: 2})
	if _, err := r.vx.Recreate(grown, from); err != nil {
		t.Fatal(err)
	}
	st, err = r.b.Commit(ctx, snap)
	if err != nil || !strings.HasPrefix(st.Detail["armed"], "stale") {
		t.Fatalf("commit after the CNI added a peer: %+v, %v; want a fresh read", st, err)
	}
	if !strings.Contains(r.vx.Dump(), "dst 198.18.0.3") {
		t.Fatalf("the peer added after the early read was lost:\n%s", r.vx.Dump())
	}

	r = newRig(t)
	snap, _ = r.b.Snapshot(ctx, from, to)
	if err := r.b.ArmCommit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	changed := flannelDevice(from)
	changed.Device.MTU = 1400
	if _, err := r.vx.Recreate(changed, from); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Commit(ctx, snap); err == nil || !strings.Contains(err.Error(), "changed since the snapshot") {
		t.Fatalf("commit over a device changed after it was armed: %v", err)
	}

	// Armed on a device already changed: not armed, the commit refuses
	// as without arming. Then Abort drops anything armed.
	r = newRig(t)
	snap, _ = r.b.Snapshot(ctx, from, to)
	if _, err := r.vx.Recreate(changed, from); err != nil {
		t.Fatal(err)
	}
	if err := r.b.ArmCommit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if r.b.armed != nil {
		t.Fatal("a device that changed since the snapshot was armed")
	}
	if _, err := r.vx.Recreate(flannelDevice(from), from); err != nil {
		t.Fatal(err)
	}
	if err := r.b.ArmCommit(ctx, snap); err != nil || r.b.armed == nil {
		t.Fatalf("arm: %v, armed %v", err, r.b.armed)
	}
	if err := r.b.Abort(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if r.b.armed != nil {
		t.Fatal("Abort left the armed read")
	}
}

// A failing recreation is an error (the agent then reverts); a failing
// conntrack cleanup is not: the device moved, and it is reported.
func TestFailures(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap, err := r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	r.vx.FailNext = errors.New("EBUSY")
	if _, err := r.b.Commit(ctx, snap); err == nil || !strings.Contains(err.Error(), "EBUSY") {
		t.Fatalf("commit with a failing recreate: %v", err)
	}
	r.ct.Err = errors.New("conntrack: netlink says no")
	st, err := r.b.Commit(ctx, snap)
	if err != nil || st.Port != to {
		t.Fatalf("commit: %+v, %v", st, err)
	}
	// The conntrack cleanup comes after the answer, and its failure is
	// reported, not a reason to undo the change.
	if d, err := r.b.AfterCommit(ctx, snap); err == nil || d["conntrack_error"] == "" {
		t.Fatalf("after commit with failing conntrack: %v, %v", d, err)
	}
	// Replayed commit: no recreation; conntrack retried after it.
	n := r.vx.Recreations
	st, err = r.b.Commit(ctx, snap)
	if err != nil || r.vx.Recreations != n || st.Detail["strategy"] != "noop" {
		t.Fatalf("replayed commit: %+v, %v (recreations %d -> %d)", st, err, n, r.vx.Recreations)
	}
	if d, err := r.b.AfterCommit(ctx, snap); err != nil || d["conntrack_deleted"] != "1" {
		t.Fatalf("after the replayed commit: %v, %v", d, err)
	}
	r.cfg.Conntrack = nil
	r.restart(t)
	if c, _ := r.b.Preflight(ctx, 4999); !strings.Contains(strings.Join(c.Actions, "\n"), "cleanup off") {
		t.Fatalf("conntrack off not described: %v", c.Actions)
	}
}

func TestBadSnapshotsAndConfig(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap, err := r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*dataplane.Snapshot)
		want string
	}{
		{func(s *dataplane.Snapshot) { s.Backend = "ovs" }, `backend "ovs"`},
		{func(s *dataplane.Snapshot) { s.Device = "vxlan.calico" }, `device "vxlan.calico"`},
		{func(s *dataplane.Snapshot) { s.Data = json.RawMessage(`{`) }, "snapshot data"},
		{func(s *dataplane.Snapshot) { s.FromPort = 4000 }, "does not match"},
	} {
		s := snap
		tc.edit(&s)
		for name, call := range map[string]func() error{
			"prepare":  func() error { return r.b.Prepare(ctx, s) },
			"commit":   func() error { _, err := r.b.Commit(ctx, s); return err },
			"revert":   func() error { _, err := r.b.Revert(ctx, s); return err },
			"abort":    func() error { return r.b.Abort(ctx, s) },
			"finalize": func() error { return r.b.Finalize(ctx, s) },
		} {
			if err := call(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s with a bad snapshot: %v, want %q", name, err, tc.want)
			}
		}
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "vxlan: no driver") {
		t.Fatalf("New without driver: %v", err)
	}
	if _, err := New(Config{VXLAN: r.vx, Device: "a-name-longer-than-15"}); err == nil || !strings.Contains(err.Error(), `device "a-name-longer-than-15"`) {
		t.Fatalf("New with a long name: %v", err)
	}
	b, err := New(Config{VXLAN: r.vx})
	if err != nil || b.Device() != "flannel.1" || b.Name() != "kernel-vxlan" {
		t.Fatalf("defaults: %v %v", b, err)
	}
}

func TestReadAndReady(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	st, err := r.b.Read(ctx)
	if err != nil || st.Port != from || st.Detail["vni"] != "1" || st.Detail["fdb"] != "1" || st.Backend != "kernel-vxlan" {
		t.Fatalf("read = %+v, %v", st, err)
	}
	if nr := r.b.Ready(ctx); len(nr) != 0 {
		t.Fatalf("ready: %v", nr)
	}
	r.vx.Delete("flannel.1")
	if nr := r.b.Ready(ctx); len(nr) != 1 || !strings.Contains(nr[0], "flannel.1") {
		t.Fatalf("ready without device: %v", nr)
	}
}

// Finalize deletes the old port's conntrack entries again: a peer that
// flipped after this node sent to the old port after Commit's deletion.
func TestFinalizeForgetsLatePeers(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	snap := r.prepared(t)
	if _, err := r.b.Commit(ctx, snap); err != nil {
		t.Fatal(err)
	}
	r.ct.Flows = append(r.ct.Flows, conntrack.Flow{Proto: "udp", Src: "198.18.0.3", Dst: "198.18.0.1", SrcPort: 40009, DstPort: from})
	if err := r.b.Finalize(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if got, want := r.dump(), wantState(t, "finalized", true); got != want {
		t.Fatalf("after finalize:\n%s\nwant:\n%s", got, want)
	}
	r.ct.Err = errors.New("netlink busy")
	if err := r.b.Finalize(ctx, snap); err == nil || !strings.Contains(err.Error(), "retry Finalize") {
		t.Fatalf("finalize with failing conntrack: %v", err)
	}
}

// TestPreparePrebuilds: Prepare prebuilds the device on the target port,
// Commit adopts it (Detail prebuilt=true), and Abort or a Revert before any
// commit removes it; a Prepare over a device that moved or changed since the
// snapshot refuses.
func TestPreparePrebuilds(t *testing.T) {
	ctx := context.Background()
	for _, end := range []string{"commit", "abort", "revert"} {
		t.Run(end, func(t *testing.T) {
			r := newRig(t)
			snap, err := r.b.Snapshot(ctx, from, to)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.b.Prepare(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if p, ok := r.vx.Prebuilt["flannel.1"]; !ok || p != to {
				t.Fatalf("after Prepare: prebuilt %v, want flannel.1 on %d", r.vx.Prebuilt, to)
			}
			switch end {
			case "commit":
				st, err := r.b.Commit(ctx, snap)
				if err != nil || st.Detail["prebuilt"] != "true" {
					t.Fatalf("commit: %+v, %v; want the prebuilt device adopted", st, err)
				}
			case "abort":
				if err := r.b.Abort(ctx, snap); err != nil {
					t.Fatal(err)
				}
			case "revert":
				if _, err := r.b.Revert(ctx, snap); err != nil {
					t.Fatal(err)
				}
			}
			// Commit adopted it; Abort and Revert removed it (a
			// leftover on the target port failed a retry's path check).
			if len(r.vx.Prebuilt) != 0 {
				t.Fatalf("after %s: prebuilt devices %v", end, r.vx.Prebuilt)
			}
		})
	}

	r := newRig(t)
	snap, err := r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	changed := flannelDevice(from)
	changed.Device.MTU = 1400
	if _, err := r.vx.Recreate(changed, from); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Prepare(ctx, snap); err == nil || !strings.Contains(err.Error(), "changed since the snapshot") {
		t.Fatalf("prepare over a changed device: %v; want a refusal", err)
	}
	if len(r.vx.Prebuilt) != 0 {
		t.Fatalf("a refused Prepare prebuilt %v", r.vx.Prebuilt)
	}
}

// prepared is Snapshot and Prepare from from to to, what every commit
// starts from.
func (r *rig) prepared(t *testing.T) dataplane.Snapshot {
	t.Helper()
	ctx := context.Background()
	snap, err := r.b.Snapshot(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.b.Prepare(ctx, snap); err != nil {
		t.Fatal(err)
	}
	return snap
}
