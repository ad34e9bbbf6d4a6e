package dataplane_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/nsiptables"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// TestKeepOpenOnRealIptables: a node whose firewall rejects
// everything but what its chain accepts, and whose overlay port 8472 has
// no rule (it rebooted, or joined, after a cutover): KeepOpen opens the
// port with the agent's marked rule, in a chain it creates, and UDP passes;
// a second call finds it. Rules someone else wrote (an operator's plain
// rule for 4889, a commented rule of theirs for 5555) are never removed:
// not when the port moves to 4889 (found, the stale marked rule of 8472
// removed), not by RemoveKept, after which iptables-save is what it was
// before the agent ran.
func TestKeepOpenOnRealIptables(t *testing.T) {
	a, b := rejectingPair(t)
	var ipt *iptables.Client
	if err := netns.Do(a, func() error {
		var err error
		ipt, err = iptables.New(t.Context(), iptables.Config{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tmpl := iptables.Rule{Table: "filter", Chain: "OS_FIREWALL_ALLOW", Proto: "udp", StateNew: true, Target: "ACCEPT"}
	fw := &dataplane.Firewall{IPT: nsiptables.IPT{NS: a, C: ipt}, CreateChain: true, JumpFrom: "INPUT", Templates: []iptables.Rule{tmpl}}
	save := func() string { return vxlantest.SaveRules(vxlantest.Run(t, a, "iptables-save -t filter")) }
	if passes(t, a, b, 8472) {
		t.Fatal("UDP 8472 passes before KeepOpen: the REJECT baseline does not hold, the test proves nothing")
	}

	k, err := fw.KeepOpen(8472, true)
	if err != nil {
		t.Fatal(err)
	}
	marked := "-A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 8472 -m comment --comment " + dataplane.KeepComment + " -j ACCEPT"
	if len(k.Opened) != 1 || k.Opened[0] != marked || !strings.Contains(save(), marked) {
		t.Fatalf("KeepOpen on a node without the rule: %+v; iptables-save:\n%s", k, save())
	}
	if !passes(t, a, b, 8472) {
		t.Fatalf("UDP 8472 refused after KeepOpen:\n%s", save())
	}
	if k, err := fw.KeepOpen(8472, true); err != nil || len(k.Opened) != 0 || !slices.Equal(k.Found, []string{marked}) {
		t.Fatalf("KeepOpen again: %+v, %v; want it found", k, err)
	}

	// Someone else's rules, written after the agent's first run.
	vxlantest.Run(t, a, "iptables -A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 4889 -j ACCEPT")
	vxlantest.Run(t, a, "iptables -A OS_FIREWALL_ALLOW -p udp -m udp --dport 5555 -m comment --comment operator-keep -j ACCEPT")
	vxlantest.Run(t, a, "iptables -A OS_FIREWALL_ALLOW -p udp -m state --state NEW -m udp --dport 6666 -m comment --comment "+dataplane.KeepComment+"-not -j ACCEPT")
	before := strings.Replace(save(), marked+"\n", "", 1)

	// The overlay moved to 4889 (the operator's rule opens it) with no
	// operation in flight: the agent's 8472 rule goes, nothing else.
	k, err = fw.KeepOpen(4889, true)
	if err != nil || len(k.Opened) != 0 || len(k.Found) != 1 || !slices.Equal(k.Removed, []string{marked}) {
		t.Fatalf("KeepOpen(4889): %+v, %v; want found, the 8472 mark removed", k, err)
	}
	if got := save(); got != before {
		t.Fatalf("after the port moved:\n%s\nwant:\n%s", got, before)
	}
	// An operation in flight: a marked rule of another port stays.
	if _, err := fw.KeepOpen(9000, false); err != nil {
		t.Fatal(err)
	}
	if k, err := fw.KeepOpen(4889, false); err != nil || len(k.Removed) != 0 || !strings.Contains(save(), "--dport 9000 -m comment") {
		t.Fatalf("KeepOpen without removeStale: %+v, %v:\n%s", k, err, save())
	}
	// Close of a port (Finalize's of the old one) takes the mark too.
	if err := fw.Close(9000, nil); err != nil {
		t.Fatal(err)
	}
	if got := save(); got != before {
		t.Fatalf("after Close(9000):\n%s\nwant:\n%s", got, before)
	}
	if _, err := fw.KeepOpen(7777, false); err != nil {
		t.Fatal(err)
	}
	removed, err := fw.RemoveKept()
	if err != nil || len(removed) != 1 {
		t.Fatalf("RemoveKept: %q, %v", removed, err)
	}
	if got := save(); got != before {
		t.Fatalf("after RemoveKept:\n%s\nwant what the operator had:\n%s", got, before)
	}
}
