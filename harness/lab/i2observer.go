package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// I2Observer watches BRIEF I2 ("no node flips before every node has the
// new port open") from outside the product: it trusts neither the
// coordinator's barrier nor the agents' records. Per node it runs two
// push monitors against the node's own systems and stamps each event on
// receipt:
//
//   - `ovsdb-client monitor` of the Interface table on the node's own
//     OVSDB socket: a row whose options carry dst_port=<to> is the flip;
//   - `nft monitor rules` in the node's namespace (iptables is the
//     nf_tables backend): an added FirewallChain rule for udp dport <to>
//     is the opening.
//
// Both are pushed by the kernel / ovsdb-server as the change is made, so
// a receipt stamp is at most a scheduling delay after the fact; the
// coordinator's commit lead (hundreds of ms at least) dwarfs that, so a
// correct run is never judged wrong, and a node that flips while another
// has not opened is seen as such as long as the opening comes later than
// that delay. OVS backend only (the flip is read from OVSDB).
type I2Observer struct {
	to    int
	nodes []string

	mu     sync.Mutex
	events []I2Event
	procs  []*exec.Cmd
	wg     sync.WaitGroup
}

// I2Event is one observed change on one node.
type I2Event struct {
	Node string
	Kind string // "open" (the new port's rule appeared) or "flip" (vxlan0 dst_port became the new port)
	At   time.Time
	Line string // what the monitor printed
}

// ObserveI2 starts the monitors on every node, waits until each OVSDB
// monitor has printed its initial table and the firewall was read once,
// and returns the observer. Stop it (it kills its monitors by PID).
func (l *Lab) ObserveI2(ctx context.Context, to int) (*I2Observer, error) {
	if l.cfg().Backend != BackendOVS {
		return nil, fmt.Errorf("lab: I2 observer: backend %s: only %s (the flip is read from OVSDB)", l.cfg().Backend, BackendOVS)
	}
	o := &I2Observer{to: to}
	ready := make(chan string, len(l.Nodes()))
	for _, n := range l.Nodes() {
		o.nodes = append(o.nodes, n.Name)
		nft := exec.Command("ip", "netns", "exec", n.Netns, "nft", "monitor", "rules")
		if err := o.start(n.Name, nft, o.nftLine, nil); err != nil {
			o.Stop()
			return nil, err
		}
		db := exec.Command("ovsdb-client", "monitor", "unix:"+n.OVSDBSock, "Open_vSwitch", "Interface", "name,options", "--format=csv")
		if err := o.start(n.Name, db, o.ovsdbLine, ready); err != nil {
			o.Stop()
			return nil, err
		}
	}
	deadline := time.After(10 * time.Second)
	for range l.Nodes() {
		select {
		case <-ready:
		case <-deadline:
			o.Stop()
			return nil, errors.New("lab: I2 observer: an OVSDB monitor printed nothing within 10 s")
		case <-ctx.Done():
			o.Stop()
			return nil, ctx.Err()
		}
	}
	// nft monitor prints nothing until a change: give it time to
	// subscribe, then record what is open already.
	time.Sleep(300 * time.Millisecond)
	for _, n := range l.Nodes() {
		rules, err := l.FirewallRules(ctx, n.Name)
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("lab: I2 observer: %w", err)
		}
		for _, r := range rules {
			if r == PortRule(to) {
				o.add(I2Event{Node: n.Name, Kind: "open", At: time.Now(), Line: "at start: " + r})
			}
		}
	}
	return o, nil
}

func (o *I2Observer) start(node string, cmd *exec.Cmd, parse func(node, line string), ready chan<- string) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("lab: I2 observer: %w", err)
	}
	cmd.Stderr = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lab: I2 observer: start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	o.mu.Lock()
	o.procs = append(o.procs, cmd)
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		first := true
		for sc.Scan() {
			if first && ready != nil {
				ready <- node
			}
			first = false
			parse(node, sc.Text())
		}
		_ = cmd.Wait()
	}()
	return nil
}

func (o *I2Observer) add(ev I2Event) {
	o.mu.Lock()
	o.events = append(o.events, ev)
	o.mu.Unlock()
}

// nftLine: "insert rule ip filter OS_FIREWALL_ALLOW meta l4proto udp ct
// state new udp dport 4889 counter packets 0 bytes 0 accept" (the agent
// inserts at the top of the chain; "add rule" for one appended by hand).
func (o *I2Observer) nftLine(node, line string) {
	at := time.Now()
	f := strings.Fields(line)
	if len(f) < 5 || (f[0] != "add" && f[0] != "insert") || f[1] != "rule" || f[4] != FirewallChain || !strings.HasSuffix(line, " accept") {
		return
	}
	if !strings.Contains(line, "udp dport "+strconv.Itoa(o.to)+" ") {
		return
	}
	o.add(I2Event{Node: node, Kind: "open", At: at, Line: line})
}

// ovsdbLine: a CSV row `uuid,new,vxlan0,"{dst_port=""4889"", ...}"` (or
// "initial"). Only a tunnel interface carries dst_port.
func (o *I2Observer) ovsdbLine(node, line string) {
	at := time.Now()
	f := strings.SplitN(line, ",", 3)
	if len(f) < 3 || (f[1] != "new" && f[1] != "initial") {
		return
	}
	if !strings.Contains(f[2], `dst_port=""`+strconv.Itoa(o.to)+`""`) {
		return
	}
	o.add(I2Event{Node: node, Kind: "flip", At: at, Line: line})
}

// Stop kills the monitors (by PID) and waits for their readers.
func (o *I2Observer) Stop() {
	o.mu.Lock()
	procs := o.procs
	o.procs = nil
	o.mu.Unlock()
	for _, c := range procs {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
	o.wg.Wait()
}

// Events returns what was observed, in order of receipt.
func (o *I2Observer) Events() []I2Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := append([]I2Event(nil), o.events...)
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At.Before(ev[j].At) })
	return ev
}

// Check judges I2 on what was observed: every node flipped (an observer
// that saw nothing proves nothing), and every node's opening was seen
// strictly before the first flip on any node. The error lists every
// violation and the timeline.
func (o *I2Observer) Check() error {
	ev := o.Events()
	opened := map[string]time.Time{}
	flipped := map[string]time.Time{}
	var first I2Event
	for _, e := range ev {
		switch e.Kind {
		case "open":
			if _, ok := opened[e.Node]; !ok {
				opened[e.Node] = e.At
			}
		case "flip":
			if _, ok := flipped[e.Node]; !ok {
				flipped[e.Node] = e.At
			}
			if first.Node == "" {
				first = e
			}
		}
	}
	var bad []string
	for _, n := range o.nodes {
		if _, ok := flipped[n]; !ok {
			bad = append(bad, fmt.Sprintf("%s: never seen flipping to %d", n, o.to))
		}
		switch t, ok := opened[n]; {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: never seen opening %d", n, o.to))
		case first.Node != "" && !t.Before(first.At):
			bad = append(bad, fmt.Sprintf("I2 violated: %s opened %d %s after %s flipped to it", n, o.to, t.Sub(first.At).Round(time.Microsecond), first.Node))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s\ntimeline:\n%s", strings.Join(bad, "\n"), o.timeline(ev))
}

func (o *I2Observer) timeline(ev []I2Event) string {
	var b strings.Builder
	var t0 time.Time
	for i, e := range ev {
		if i == 0 {
			t0 = e.At
		}
		fmt.Fprintf(&b, "  +%-12s %-3s %-4s %s\n", e.At.Sub(t0).Round(time.Microsecond), e.Node, e.Kind, e.Line)
	}
	return b.String()
}

// Summary is the timeline's figures: the lead of the last opening over
// the first flip.
func (o *I2Observer) Summary() string {
	ev := o.Events()
	var lastOpen, firstFlip time.Time
	for _, e := range ev {
		if e.Kind == "open" && e.At.After(lastOpen) {
			lastOpen = e.At
		}
		if e.Kind == "flip" && firstFlip.IsZero() {
			firstFlip = e.At
		}
	}
	if lastOpen.IsZero() || firstFlip.IsZero() {
		return "incomplete: " + strconv.Itoa(len(ev)) + " events"
	}
	return fmt.Sprintf("%d events; last opening %s before the first flip", len(ev), firstFlip.Sub(lastOpen).Round(time.Microsecond))
}
