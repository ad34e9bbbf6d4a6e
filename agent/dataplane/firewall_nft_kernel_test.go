package dataplane_test

// Privileged: hosts whose filtering lives in native nftables tables. Every
// base chain on the input hook sees the packet and a drop in any of them is
// final, so the ACCEPT pkg/iptables writes into iptables-nft's ip filter
// INPUT does not open the port alone. Measured here with real nft and
// iptables-nft in fresh namespaces: UDP to the new port is refused before
// Open, passes after it (open mode), and is refused again after Close; in
// refuse mode, and for firewalld's table always, Open fails naming the
// table and chain and the rulesets are byte-identical afterwards. The bite
// test turns the nftables handling off and shows the packet stays dropped.

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/agent/dataplane"
	"github.com/cutover-dev/cutover/harness/nsiptables"
	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/harness/vxlantest"
	"github.com/cutover-dev/cutover/pkg/execseam"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/nftables"
)

// inetDrop is a hand-written host firewall as Debian's /etc/nftables.conf
// starts: an inet table whose input chain drops by policy.
const inetDrop = `table inet hostfw {
	chain input {
		type filter hook input priority filter; policy drop;
		ct state established,related accept
		iif "lo" accept
		tcp dport 22 accept
	}
}
`

// nftFirewall returns a Firewall for namespace a (iptables-nft and nft
// both run inside it) with the port's rule in filter INPUT, and a loader
// for an nft ruleset file's text.
func nftFirewall(t *testing.T, a, mode string) *dataplane.Firewall {
	t.Helper()
	testenv.RequireBinaries(t, "nft")
	var ipt *iptables.Client
	if err := netns.Do(a, func() error {
		var err error
		ipt, err = iptables.New(t.Context(), iptables.Config{Backend: iptables.BackendNFT})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	run := func(ctx context.Context, argv, env []string) (out []byte, err error) {
		err = netns.Do(a, func() error { out, err = execseam.Exec(ctx, argv, env); return err })
		return out, err
	}
	return &dataplane.Firewall{IPT: nsiptables.IPT{NS: a, C: ipt}, JumpFrom: "INPUT",
		NFT: &nftables.Client{Run: run}, NFTMode: mode,
		Templates: []iptables.Rule{{Table: "filter", Chain: "INPUT", Proto: "udp", StateNew: true, Target: "ACCEPT"}}}
}

func nftLoad(t *testing.T, ns, ruleset string) {
	t.Helper()
	f := t.TempDir() + "/ruleset.nft"
	if err := os.WriteFile(f, []byte(ruleset), 0o600); err != nil {
		t.Fatal(err)
	}
	vxlantest.Run(t, ns, "nft -f "+f)
}

// rulesets is everything a's firewall holds, both views.
func rulesets(t *testing.T, ns string) string {
	t.Helper()
	return vxlantest.Run(t, ns, "nft list ruleset") + "\n---\n" + vxlantest.SaveRules(vxlantest.Run(t, ns, "iptables-nft-save"))
}

func TestFirewallOpensPastANativeNftablesDrop(t *testing.T) {
	a, b := rejectingPair(t) // iptables' INPUT ends in a REJECT as well
	nftLoad(t, a, inetDrop)
	fw := nftFirewall(t, a, dataplane.NFTOpen)
	if passes(t, a, b, 4889) {
		t.Fatal("UDP 4889 passes before Open: the baseline does not drop, the test proves nothing")
	}
	problems, prepare, _ := fw.NFTCheck(4789, 4889)
	if len(problems) != 0 || len(prepare) != 1 || !strings.Contains(prepare[0], "nft insert rule inet hostfw input") {
		t.Fatalf("preflight: problems %q, prepare %q; want no problem and the insert into inet hostfw input", problems, prepare)
	}
	if err := fw.Open(4889); err != nil {
		t.Fatal(err)
	}
	if !passes(t, a, b, 4889) {
		t.Fatalf("UDP 4889 refused after Open:\n%s", rulesets(t, a))
	}
	present, err := fw.Present(4889)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(present); n != 2 {
		t.Errorf("Present = %v, want the iptables rule and the nft opening", present)
	}
	if err := fw.Open(4889); err != nil { // idempotent: a replayed Prepare
		t.Fatal(err)
	}
	if n := strings.Count(vxlantest.Run(t, a, "nft list chain inet hostfw input"), nftables.Comment(4889)); n != 1 {
		t.Errorf("after a second Open the chain holds %d openings, want 1", n)
	}
	if err := fw.Close(4889, nil); err != nil {
		t.Fatal(err)
	}
	if passes(t, a, b, 4889) {
		t.Fatal("UDP 4889 still passes after Close")
	}
	if s := rulesets(t, a); strings.Contains(s, nftables.Comment(4889)) || !strings.Contains(s, "tcp dport 22 accept") {
		t.Errorf("after Close: want our opening gone and the host's rules kept:\n%s", s)
	}
}

// TestFirewallNftablesBite: with the nftables handling switched off the
// iptables opening alone lands, and the packet is still dropped by the
// inet table: the test above fails without the handling.
func TestFirewallNftablesBite(t *testing.T) {
	a, b := rejectingPair(t)
	nftLoad(t, a, inetDrop)
	fw := nftFirewall(t, a, dataplane.NFTOpen)
	dataplane.SkipNFT(fw)
	if err := fw.Open(4889); err != nil {
		t.Fatal(err)
	}
	if ok, err := fw.IPT.HasRule(fw.Rules(4889)[0]); err != nil || !ok {
		t.Fatalf("the iptables opening is not in place (%v, %v): the bite would prove nothing", ok, err)
	}
	if passes(t, a, b, 4889) {
		t.Fatal("UDP 4889 passes with only the iptables opening: the native table does not drop it, so TestFirewallOpensPastANativeNftablesDrop proves nothing")
	}
}

func TestFirewallRefusesNamedNftablesChain(t *testing.T) {
	firewalld, err := os.ReadFile("../../pkg/nftables/testdata/firewalld.nft")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mode, ruleset, want string
	}{
		{"refuse mode", dataplane.NFTRefuse, inetDrop, "table inet hostfw chain input (hook input, policy drop"},
		{"firewalld in open mode", dataplane.NFTOpen, string(firewalld), "table inet firewalld chain filter_INPUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := rejectingPair(t)
			nftLoad(t, a, tc.ruleset)
			fw := nftFirewall(t, a, tc.mode)
			problems, _, _ := fw.NFTCheck(4789, 4889)
			if len(problems) != 1 || !strings.Contains(problems[0], tc.want) {
				t.Fatalf("preflight problems %q, want one naming %q", problems, tc.want)
			}
			before := rulesets(t, a)
			err := fw.Open(4889)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing changed") {
				t.Fatalf("Open: err = %v, want a refusal naming %q", err, tc.want)
			}
			if after := rulesets(t, a); after != before {
				t.Fatalf("a refused Open changed the firewall:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if passes(t, a, b, 4889) {
				t.Fatal("UDP 4889 passes after a refused Open")
			}
		})
	}
}

// TestFirewallFirewalldPortOpenedByOperator: once the operator opens the
// port in firewalld (here the rule firewall-cmd --add-port=4889/udp puts in
// the zone's allow chain), preflight passes and the packet gets through:
// the analysis' notion of "accepted" matches the kernel's.
func TestFirewallFirewalldPortOpenedByOperator(t *testing.T) {
	firewalld, err := os.ReadFile("../../pkg/nftables/testdata/firewalld.nft")
	if err != nil {
		t.Fatal(err)
	}
	a, b := rejectingPair(t)
	nftLoad(t, a, string(firewalld))
	vxlantest.Run(t, a, "nft add rule inet firewalld filter_IN_public_allow udp dport 4889 accept")
	fw := nftFirewall(t, a, dataplane.NFTOpen)
	if problems, prepare, _ := fw.NFTCheck(4789, 4889); len(problems) != 0 || len(prepare) != 0 {
		t.Fatalf("preflight: problems %q, prepare %q; want none (firewalld accepts the port)", problems, prepare)
	}
	if passes(t, a, b, 4889) {
		t.Fatal("UDP 4889 passes before Open: iptables' REJECT does not hold, the test proves nothing")
	}
	if err := fw.Open(4889); err != nil {
		t.Fatal(err)
	}
	if !passes(t, a, b, 4889) {
		t.Fatalf("UDP 4889 refused after Open with firewalld accepting it:\n%s", rulesets(t, a))
	}
}
