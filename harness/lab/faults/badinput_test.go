package faults_test

import (
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/pkg/netns"
)

// Every bad input of the control-plane issue, through coordctl against the
// real coordinator and agents: a clear error naming the field, value or
// node, exit ≠ 0, and OVS, iptables, flows, every agent state file and the
// journal byte for byte unchanged (I6).
func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t, "bad")

	// A UDP socket bound on n2 at the target port.
	n2, _ := e.l.Node("n2")
	var held net.PacketConn
	if err := netns.Do(n2.Netns, func() error {
		var err error
		held, err = net.ListenPacket("udp4", "0.0.0.0:4999")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Close() }()

	cases := []struct {
		name string
		args []string
		code int    // the exact exit code docs/faults.md lists
		want string // regexp the output must match: names the field/value/node
	}{
		{"port 0", []string{"cutover", "--port", "0"}, 2, `port.*0`},
		{"port 65536", []string{"cutover", "--port", "65536"}, 2, `65536`},
		{"port not a number", []string{"cutover", "--port", "abc"}, 2, `port.*abc`},
		{"port negative", []string{"cutover", "--port", "-1"}, 2, `port.*-1`},
		{"port equal to the current one", []string{"cutover", "--port", "4789"}, 2, `4789`},
		{"port in the NodePort range", []string{"cutover", "--port", "30080"}, 2, `(?i)30080.*nodeport|nodeport.*30080`},
		{"Geneve port", []string{"cutover", "--port", "6081"}, 2, `6081`},
		{"flannel VXLAN port", []string{"cutover", "--port", "8472"}, 2, `8472`},
		{"port bound by a socket on n2", []string{"cutover", "--port", "4999"}, 4, `n2.*4999|4999.*n2`},
		{"unknown node", []string{"cutover", "--port", "4889", "--nodes", "n1,n9"}, 2, `n9`},
		{"plan with a bad port", []string{"plan", "--port", "70000"}, 2, `70000`},
		// A subset of one overlay would leave it on two ports.
		{"subset that would split the overlay", []string{"cutover", "--port", "4889", "--nodes", "n1,n2"}, 4, `n1,n2 would move to 4889 while n3.* stays? on 4789`},
		{"plan of a subset that would split the overlay", []string{"plan", "--port", "4889", "--nodes", "n1,n2"}, 4, `n1,n2 could no longer reach n3`},
	}
	before := e.snap()
	for _, tc := range cases {
		r := e.coordctl(tc.args...)
		t.Logf("%s: exit %d: %s", tc.name, r.code, firstLines(r.out, 4))
		if r.code != tc.code {
			t.Errorf("%s: exit %d, want %d (docs/faults.md, coordctl help exit-codes)", tc.name, r.code, tc.code)
		}
		if !regexp.MustCompile(tc.want).MatchString(r.out) {
			t.Errorf("%s: error does not name %s:\n%s", tc.name, tc.want, r.out)
		}
		e.assertUnchanged(before)
		e.fact("bad input: "+tc.name, "coordctl "+tc.args[0], "clear error, exit ≠ 0, nothing changed", "exit "+itoa(r.code)+", unchanged", 0)
	}

	// Drift: n3's port changed behind the agents' back.
	if err := e.l.SetPortDirect(e.ctx, "n3", 4790); err != nil {
		t.Fatal(err)
	}
	drift := e.snap()
	r := e.coordctl("cutover", "--port", "4889")
	t.Logf("drift: exit %d: %s", r.code, firstLines(r.out, 6))
	if r.code != 4 || !regexp.MustCompile(`4790`).MatchString(r.out) {
		t.Errorf("drift: exit %d, want 4, refused naming n3's 4790:\n%s", r.code, r.out)
	}
	e.assertUnchanged(drift)
	e.fact("bad input: nodes disagree on the current port (n3 on 4790)", "coordctl cutover", "refused naming the drift, nothing changed", "exit "+itoa(r.code)+", unchanged", 0)
	if err := e.l.SetPortDirect(e.ctx, "n3", fromPort); err != nil {
		t.Fatal(err)
	}

	// An operation already running (held at prepare by a frozen n3).
	wait := e.coordctlBG("cutover", "--port", "4889")
	n3 := e.holdPrepare("n3")
	e.waitPhase("n1", "PREPARED", 5*time.Second)
	running := e.journal().ID
	mid := e.snap()
	r = e.coordctl("cutover", "--port", "4999")
	if r.code != 4 || !regexp.MustCompile(regexp.QuoteMeta(running)).MatchString(r.out) {
		t.Errorf("second operation: exit %d, want 4, refused naming %s:\n%s", r.code, running, r.out)
	}
	// The running operation's own journal record may move on meanwhile;
	// the refused one must leave no trace. Compared while the first is
	// still held at prepare.
	e.assertUnchanged(mid, running+".json")
	_ = lab.Thaw(n3)
	_ = wait()
	e.fact("bad input: an operation already running", "coordctl cutover", "refused naming it, nothing changed", "exit "+itoa(r.code)+", unchanged", 0)
}

func firstLines(s string, n int) string {
	re := regexp.MustCompile(`\n`)
	idx := re.FindAllStringIndex(s, n)
	if len(idx) < n {
		return s
	}
	return s[:idx[n-1][0]]
}
