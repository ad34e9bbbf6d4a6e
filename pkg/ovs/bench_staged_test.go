package ovs

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
)

// BenchmarkStagedSwitch measures one node's staged switch and its undo,
// each one transaction that ovs-vswitchd applied (cur_cfg) when it returns:
// the old port's receiver added and vxlan0 moved onto the new port, then
// vxlan0 moved back and the receiver removed. With ChangePorts, and with
// the ovs-vsctl commands the agent ran for the same before it spoke OVSDB
// for them (ovs-vsctl also waits for cur_cfg). Alternating, so both see
// the same machine. It prints median and p99 and writes
// $CUTOVER_RESULTS/ovs_staged_switch.json. Figures, not a pass/fail.
func BenchmarkStagedSwitch(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipped: needs root to run ovsdb-server/ovs-vswitchd in a network namespace")
	}
	const rounds = 100
	ctx := context.Background()
	inst := startOVS(b)
	c, err := New(Config{Addr: "unix:" + inst.DBSock})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	// The listen's receiver, as the agent leaves it before the switch.
	if err := c.ChangePorts(ctx, PortsChange{Bridge: "br0", Add: []Interface{rxPort("vxlan0-cot", "4889", 65278)}}); err != nil {
		b.Fatal(err)
	}
	old := rxPort("vxlan0-cot-old", "4789", 65279)
	sw := PortsChange{Bridge: "br0", Add: []Interface{old}, Move: []Move{{"vxlan0", 4789, 4889}}}
	back := PortsChange{Bridge: "br0", Move: []Move{{"vxlan0", 4889, 4789}}, Del: []string{old.Name}}
	vsctlSw := []string{"--may-exist", "add-port", "br0", old.Name, "--", "set", "interface", old.Name, "type=vxlan",
		"ofport_request=" + strconv.FormatInt(old.OFPortRequest, 10)}
	for _, k := range sortedKeys(old.Options) {
		vsctlSw = append(vsctlSw, "options:"+k+"="+old.Options[k])
	}
	vsctlSw = append(vsctlSw, "--", "set", "interface", "vxlan0", "options:dst_port=4889")
	vsctlBack := []string{"set", "interface", "vxlan0", "options:dst_port=4789", "--", "--if-exists", "del-port", "br0", old.Name}

	timed := func(fn func() error) time.Duration {
		start := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	vsctl := func(args []string) func() error {
		return func() error { _, err := inst.Vsctl(ctx, args...); return err }
	}
	var nSw, nBack, eSw, eBack []time.Duration
	for range rounds {
		nSw = append(nSw, timed(func() error { return c.ChangePorts(ctx, sw) }))
		nBack = append(nBack, timed(func() error { return c.ChangePorts(ctx, back) }))
		eSw = append(eSw, timed(vsctl(vsctlSw)))
		eBack = append(eBack, timed(vsctl(vsctlBack)))
	}
	if got, err := c.GetInterface(ctx, "vxlan0"); err != nil || got.Options["dst_port"] != "4789" {
		b.Fatalf("vxlan0 after the rounds: %s, %v", got, err)
	}
	s := map[string]benchresult.Summary{
		"native_switch": benchresult.Summarize(nSw), "native_unswitch": benchresult.Summarize(nBack),
		"vsctl_switch": benchresult.Summarize(eSw), "vsctl_unswitch": benchresult.Summarize(eBack),
	}
	b.Logf("staged switch and unswitch, %d rounds, %d CPUs", rounds, runtime.NumCPU())
	res := map[string]any{
		"benchmark": "ovs_staged_switch",
		"what":      "one node's staged switch (receiver added, vxlan0 moved) and unswitch, one transaction each: sent -> cur_cfg applied",
		"rounds":    rounds, "cpus": runtime.NumCPU(), "ovs_userspace": true,
	}
	for _, k := range []string{"native_switch", "vsctl_switch", "native_unswitch", "vsctl_unswitch"} {
		b.Logf("  %-16s median %8s  p99 %8s", k, s[k].Median, s[k].P99)
		res[k+"_median_us"], res[k+"_p99_us"] = benchresult.Micros(s[k].Median), benchresult.Micros(s[k].P99)
	}
	benchresult.Save(b, "ovs_staged_switch.json", res)
}
