package ovsvxlan

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/nftables"
	"github.com/cutover-dev/cutover/pkg/ovs"
	"github.com/cutover-dev/cutover/pkg/udpport"
)

var allowTemplate = iptables.Rule{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}

type rig struct {
	ovs *ovs.Fake
	ipt *iptables.Fake
	b   *Backend
}

func newRig(t *testing.T) rig {
	t.Helper()
	of := ovs.NewFake(ovs.Interface{Name: "vxlan0", Type: "vxlan", OFPort: 1,
		Options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": "4789"}})
	ipt := iptables.NewFake(iptables.BackendNFT)
	if err := ipt.EnsureChain("filter", "OS_FIREWALL_ALLOW"); err != nil {
		t.Fatal(err)
	}
	r := allowTemplate
	r.DPort = 4789
	if err := ipt.EnsureRule(r); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{OVS: of, Interface: "vxlan0", Bridge: "br0", Ports: &udpport.Fake{},
		Firewall: &dataplane.Firewall{IPT: ipt, Templates: []iptables.Rule{allowTemplate}}})
	if err != nil {
		t.Fatal(err)
	}
	return rig{of, ipt, b}
}

func (r rig) dump() string { return r.ovs.Dump() + r.ipt.Dump() }

// TestDesiredStatesInAnyOrder replays every step twice, in random orders of
// the legal sequences, and compares the fakes' dumps with the expected state
// after each: every step is idempotent and reaches the same state whatever
// was replayed before it (STYLE.md habit 7).
func TestDesiredStatesInAnyOrder(t *testing.T) {
	ctx := context.Background()
	sequences := [][]string{
		{"prepare", "commit", "finalize"},
		{"prepare", "abort"},
		{"prepare", "commit", "revert"},
		{"prepare", "revert"}, // commit lost: revert must still undo prepare
	}
	want := map[string]struct{ port, rules string }{
		"prepare":  {"4789", "4789 4889"},
		"commit":   {"4889", "4789 4889"},
		"finalize": {"4889", "4889"},
		"abort":    {"4789", "4789"},
		"revert":   {"4789", "4789"},
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 40; i++ {
		seq := sequences[rnd.IntN(len(sequences))]
		r := newRig(t)
		snap, err := r.b.Snapshot(ctx, 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range seq {
			for rep := 0; rep < 1+rnd.IntN(3); rep++ {
				var err error
				switch step {
				case "prepare":
					err = r.b.Prepare(ctx, snap)
				case "commit":
					_, err = r.b.Commit(ctx, snap)
				case "finalize":
					err = r.b.Finalize(ctx, snap)
				case "abort":
					err = r.b.Abort(ctx, snap)
				case "revert":
					_, err = r.b.Revert(ctx, snap)
				}
				if err != nil {
					t.Fatalf("%v: %s (repeat %d): %v", seq, step, rep, err)
				}
				checkState(t, r, seq, step, want[step].port, want[step].rules)
			}
		}
	}
}

func checkState(t *testing.T, r rig, seq []string, step, port, rules string) {
	t.Helper()
	d := r.dump()
	if !strings.Contains(d, "dst_port="+port) {
		t.Fatalf("%v after %s: want dst_port=%s in\n%s", seq, step, port, d)
	}
	var got []string
	for _, p := range []string{"4789", "4889"} {
		if strings.Contains(d, "--dport "+p+" ") {
			got = append(got, p)
		}
	}
	if strings.Join(got, " ") != rules {
		t.Fatalf("%v after %s: firewall ports %v, want %s\n%s", seq, step, got, rules, d)
	}
}

// A target-port rule that an operator had installed before Cutover ran
// survives an abort: Cutover removes only what it added.
func TestAbortKeepsPreexistingRule(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	pre := allowTemplate
	pre.DPort = 4889
	if err := r.ipt.EnsureRule(pre); err != nil {
		t.Fatal(err)
	}
	snap, err := r.b.Snapshot(ctx, 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.b.Prepare(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Abort(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.ipt.Dump(), "--dport 4889 ") {
		t.Fatalf("pre-existing 4889 rule removed by abort:\n%s", r.ipt.Dump())
	}
}

func TestPreflightProblems(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	r.b.cfg.Ports.(*udpport.Fake).Hold(4889, udpport.Holder{Kind: "socket", Inode: 7, Local: "0.0.0.0:4889"})
	c, err := r.b.Preflight(ctx, 4889)
	if err != nil {
		t.Fatal(err)
	}
	if c.CurrentPort != 4789 || c.TargetFree || !strings.Contains(strings.Join(c.Problems, ";"), "in use on this node by socket inode 7") {
		t.Fatalf("preflight = %+v", c)
	}
	if c, _ := r.b.Preflight(ctx, 4789); !strings.Contains(strings.Join(c.Problems, ";"), "target port 4789: OVS interface vxlan0 already uses it: nothing to change; pick another port") {
		t.Fatalf("same port not flagged: %+v", c)
	}
	r.ovs.Set(ovs.Interface{Name: "vxlan0", Type: "vxlan", OFPort: -1, Error: "could not add network device vxlan0",
		Options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": "4789"}})
	if c, _ := r.b.Preflight(ctx, 4999); !strings.Contains(strings.Join(c.Problems, ";"), "failed already") {
		t.Fatalf("failed interface not flagged: %+v", c)
	}
	if len(r.ipt.Dump()) == 0 || r.ovs.Writes() != 0 {
		t.Fatalf("preflight wrote to OVS: %d writes", r.ovs.Writes())
	}
}

func TestSnapshotRefusesWrongFromAndRevertRefusesDrift(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	if _, err := r.b.Snapshot(ctx, 4000, 4889); err == nil || !strings.Contains(err.Error(), "current port is 4789, not 4000 (from_port)") || !strings.Contains(err.Error(), "plan again") {
		t.Fatalf("Snapshot with wrong from: %v", err)
	}
	snap, err := r.b.Snapshot(ctx, 4789, 4889)
	if err != nil {
		t.Fatal(err)
	}
	// Another controller moves the port to 5000 behind our back.
	if _, err := r.ovs.SetDstPort(ctx, "vxlan0", 4789, 5000); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Commit(ctx, snap); !ovs.IsConflict(err) {
		t.Fatalf("commit over a concurrent change: %v, want a conflict", err)
	}
	if _, err := r.b.Revert(ctx, snap); err == nil || !strings.Contains(err.Error(), "neither") || !strings.Contains(err.Error(), "ovs-vsctl set interface vxlan0 options:dst_port=4789") {
		t.Fatalf("revert with drift: %v", err)
	}
	if !strings.Contains(r.ovs.Dump(), "dst_port=5000") {
		t.Fatal("revert touched a port it does not own")
	}
}

// With the interface deleted by hand, every report says exactly that, in
// the same words (so the agent and the coordinator can say it once): not a
// port 0 the node would be on, nor a target port "held" by nobody.
func TestMissingInterfaceReportedAsMissing(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	r.ovs.Delete("vxlan0")
	const want = "vxlan0 not found in OVS bridge br0: "
	c, err := r.b.Preflight(ctx, 4999)
	if err != nil {
		t.Fatal(err)
	}
	if c.CurrentPort != 0 || !c.TargetFree || c.TargetHolder != "" || len(c.Problems) != 1 || !strings.HasPrefix(c.Problems[0], want) {
		t.Fatalf("preflight = %+v, want current port 0 (unknown), target free, one problem starting %q", c, want)
	}
	_, rerr := r.b.Read(ctx)
	if rerr == nil || rerr.Error() != c.Problems[0] || !ovs.IsNotFound(rerr) {
		t.Fatalf("Read = %v, want %q (and ovs.IsNotFound)", rerr, c.Problems[0])
	}
	if nr := r.b.Ready(ctx); len(nr) != 1 || nr[0] != c.Problems[0] {
		t.Fatalf("Ready = %q, want [%q]", nr, c.Problems[0])
	}
	if _, err := r.b.Snapshot(ctx, 4789, 4999); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Snapshot = %v, want %q", err, want)
	}
	// A target port that is held is still found held.
	r.b.cfg.Ports.(*udpport.Fake).Hold(4999, udpport.Holder{Kind: "socket", Inode: 7, Local: "0.0.0.0:4999"})
	if c, _ := r.b.Preflight(ctx, 4999); c.TargetFree || !strings.Contains(strings.Join(c.Problems, ";"), "in use on this node by socket inode 7") {
		t.Fatalf("held target with the interface missing: %+v", c)
	}
}

// TestCommitUsesPreparedChange: Commit applies the change Prepare built (a
// compare-and-set against the row as Prepare read it), and without one (an
// agent restarted between Prepare and Commit) builds it itself.
func TestCommitUsesPreparedChange(t *testing.T) {
	ctx := context.Background()

	t.Run("row changed after prepare: commit refuses", func(t *testing.T) {
		r := newRig(t)
		snap, err := r.b.Snapshot(ctx, 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.b.Prepare(ctx, snap); err != nil {
			t.Fatal(err)
		}
		i, _ := r.ovs.GetInterface(ctx, "vxlan0")
		i.Options["tos"] = "inherit" // another controller, after Prepare
		r.ovs.Set(i)
		if _, err := r.b.Commit(ctx, snap); !ovs.IsConflict(err) {
			t.Fatalf("commit after the row changed: %v, want a conflict from the prepared compare-and-set", err)
		}
		if got, _ := r.ovs.GetInterface(ctx, "vxlan0"); got.Options["dst_port"] != "4789" {
			t.Fatalf("dst_port = %s after a refused commit, want 4789", got.Options["dst_port"])
		}
	})

	t.Run("restarted agent: commit without prepare's cache", func(t *testing.T) {
		r := newRig(t)
		snap, err := r.b.Snapshot(ctx, 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.b.Prepare(ctx, snap); err != nil {
			t.Fatal(err)
		}
		fresh, err := New(r.b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		st, err := fresh.Commit(ctx, snap)
		if err != nil || st.Port != 4889 {
			t.Fatalf("commit on a restarted backend: %+v, %v; want port 4889", st, err)
		}
	})

	t.Run("abort drops the prepared change", func(t *testing.T) {
		r := newRig(t)
		snap, err := r.b.Snapshot(ctx, 4789, 4889)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.b.Prepare(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if err := r.b.Abort(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if r.b.takePending(4789, 4889) != nil {
			t.Fatal("a prepared change survived Abort")
		}
	})
}

// A native nftables table that drops the port reaches the preflight: as a
// problem naming it (firewalld's, or --nftables=refuse), or as the insert
// Prepare will make (--nftables=open). The nft ruleset comes from a fake
// exec seam with firewalld's layout (pkg/nftables/testdata).
func TestPreflightNativeNftables(t *testing.T) {
	ctx := context.Background()
	rs := map[string]string{
		"firewalld": `{"nftables":[{"chain":{"family":"inet","table":"firewalld","name":"filter_INPUT","type":"filter","hook":"input","prio":10,"policy":"accept"}},
{"rule":{"family":"inet","table":"firewalld","chain":"filter_INPUT","handle":9,"expr":[{"reject":{"type":"icmpx","expr":"admin-prohibited"}}]}}]}`,
		"hostfw": `{"nftables":[{"chain":{"family":"inet","table":"hostfw","name":"input","type":"filter","hook":"input","prio":0,"policy":"drop"}}]}`,
	}
	for _, tc := range []struct {
		table, mode, problem, action string
	}{
		{"firewalld", dataplane.NFTOpen, "table inet firewalld chain filter_INPUT", ""},
		{"hostfw", dataplane.NFTRefuse, "table inet hostfw chain input", ""},
		{"hostfw", dataplane.NFTOpen, "", "nft insert rule inet hostfw input meta nfproto ipv4 udp dport 4889 accept"},
		{"hostfw", dataplane.NFTIgnore, "", ""},
	} {
		t.Run(tc.table+"_"+tc.mode, func(t *testing.T) {
			r := newRig(t)
			r.b.cfg.Firewall.NFTMode = tc.mode
			r.b.cfg.Firewall.NFT = &nftables.Client{Run: func(_ context.Context, argv, _ []string) ([]byte, error) {
				if strings.Join(argv, " ") != "nft -j list ruleset" {
					t.Errorf("preflight ran %q: it must only read", argv)
				}
				return []byte(rs[tc.table]), nil
			}}
			c, err := r.b.Preflight(ctx, 4889)
			if err != nil {
				t.Fatal(err)
			}
			problems, actions := strings.Join(c.Problems, "\n"), strings.Join(c.Actions, "\n")
			if (tc.problem == "") != (problems == "") || !strings.Contains(problems, tc.problem) {
				t.Errorf("problems %q, want %q", problems, tc.problem)
			}
			if tc.action != "" && !strings.Contains(actions, tc.action) {
				t.Errorf("actions %q, want %q", actions, tc.action)
			}
		})
	}
}
