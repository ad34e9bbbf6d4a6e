package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// I2Observer watches BRIEF I2 ("no node flips before every node has the
// new port open") from outside the product: it trusts neither the
// coordinator's barrier nor the agents' records. Per node it runs push
// monitors against the node's own systems and stamps each event on
// receipt; from them it keeps, per node, three facts about the new port
// and records each change of one as an event:
//
//   - open/close: the node's firewall accepts the port. `nft -a monitor
//     rules` in the node's namespace (iptables is the nf_tables backend):
//     an added FirewallChain accept rule for udp dport <to> opens, the
//     deletion of the last such rule (by its handle) closes. Both
//     backends.
//   - flip/unflip: the node SENDS the new port. OVS: `ovsdb-client
//     monitor` of the Interface table on the node's own OVSDB socket,
//     vxlan0's row with options dst_port=<to>. Kernel VXLAN: `ip -o -d
//     monitor link` and `bridge -d monitor fdb` in the node's namespace:
//     the overlay device (flannel.1: its addresses, routes and neighbours
//     are what the node's pods send through) up with dstport <to>, or any
//     of its FDB remotes carrying a per-entry port <to>. The atomic
//     change's flip is the first (the prebuilt twin renamed to flannel.1
//     and set up in one request: the device the routes use is on the new
//     port from that instant); the staged change's SwitchSend is the
//     second (the device stays on the old port, its remotes are sent to
//     on the new one); its Retire makes the first true while the second
//     was already, so it is no new flip.
//   - listen/unlisten: the node RECEIVES the new port: some tunnel on it
//     is up. Kernel: any VXLAN link up with dstport <to> (the staged
//     change's twin under vxlan.TmpName, or the device itself once on the
//     port); OVS: any tunnel row with dst_port=<to> (the staged change's
//     receive port, or vxlan0). The prebuilt device of the atomic change
//     is down and binds nothing: it is not listening.
//
// All monitors are pushed by the kernel / ovsdb-server as the change is
// made, so a receipt stamp is at most a scheduling delay after the fact;
// the coordinator's commit lead (hundreds of ms at least) dwarfs that, so
// a correct run is never judged wrong, and a node that flips while another
// has not opened is seen as such as long as the opening comes later than
// that delay.
//
// What Check holds the timeline to is per strategy (I2Rules): see
// CheckWith.
type I2Observer struct {
	to      int
	backend string
	nodes   []string

	mu     sync.Mutex
	events []I2Event
	state  map[string]*i2Node
	procs  []*exec.Cmd
	wg     sync.WaitGroup
}

// I2Event is one observed change on one node.
type I2Event struct {
	Node string
	// Kind is the fact that changed: "open"/"close" (the firewall accepts
	// the new port / no longer does), "flip"/"unflip" (the node starts /
	// stops sending the new port), "listen"/"unlisten" (a tunnel of the
	// node starts / stops receiving it).
	Kind string
	At   time.Time
	Line string // what the monitor printed
}

// i2Node is one node's current facts, as the monitors last told them.
type i2Node struct {
	rules map[string]bool // handles of the open rules ("start" for one seen in the initial read without a handle)

	open, send, listen bool

	// Kernel VXLAN: every VXLAN link by ifindex, and the remotes of the
	// overlay device sent to on the new port. The FDB set belongs to the
	// device's ifindex devIndex: a new device (a recreation) starts empty.
	links    map[string]i2Link
	devIndex string
	fdbTo    map[string]bool

	// OVS: the tunnel rows on the new port, by uuid.
	rows map[string]bool
}

type i2Link struct {
	name string
	up   bool
	port int
}

// kernelDevice is the lab's kernel VXLAN overlay device (topo.go).
const kernelDevice = KernelDevice

// KernelDevice is the kernel VXLAN device of a kernel-vxlan lab's nodes,
// flannel's name.
const KernelDevice = "flannel.1"

// ObserveI2 starts the monitors on every node for a move to port to,
// waits until they are subscribed and the current state was read once,
// and returns the observer. Stop it (it kills its monitors by PID).
// Both backends.
func (l *Lab) ObserveI2(ctx context.Context, to int) (*I2Observer, error) {
	backend := l.cfg().Backend
	var names []string
	for _, n := range l.Nodes() {
		names = append(names, n.Name)
	}
	o := newI2Observer(to, backend, names)
	ready := make(chan string, len(l.Nodes()))
	for _, n := range l.Nodes() {
		nft := exec.Command("ip", "netns", "exec", n.Netns, "nft", "-a", "monitor", "rules")
		if err := o.start(n.Name, nft, o.nftLine, nil); err != nil {
			o.Stop()
			return nil, err
		}
		switch backend {
		case BackendOVS:
			db := exec.Command("ovsdb-client", "monitor", "unix:"+n.OVSDBSock, "Open_vSwitch", "Interface", "name,options", "--format=csv")
			if err := o.start(n.Name, db, o.ovsdbLine, ready); err != nil {
				o.Stop()
				return nil, err
			}
		case BackendKernelVXLAN:
			link := exec.Command("ip", "-n", n.Netns, "-o", "-d", "monitor", "link")
			if err := o.start(n.Name, link, o.linkLine, nil); err != nil {
				o.Stop()
				return nil, err
			}
			fdb := exec.Command("ip", "netns", "exec", n.Netns, "bridge", "-d", "monitor", "fdb")
			if err := o.start(n.Name, fdb, o.fdbLine, nil); err != nil {
				o.Stop()
				return nil, err
			}
		default:
			o.Stop()
			return nil, fmt.Errorf("lab: I2 observer: backend %q: want %s or %s", backend, BackendOVS, BackendKernelVXLAN)
		}
	}
	if backend == BackendOVS {
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
	}
	// nft and ip monitors print nothing until a change: give them time to
	// subscribe, then read what holds already through the same parsers. A
	// change between the subscription and the read is seen twice, which
	// the per-node facts absorb (a fact that does not change records no
	// event).
	time.Sleep(300 * time.Millisecond)
	for _, n := range l.Nodes() {
		out, err := run(ctx, "", "ip", "netns", "exec", n.Netns, "nft", "-a", "list", "chain", "ip", "filter", FirewallChain)
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("lab: I2 observer: %w", err)
		}
		for _, line := range strings.Split(out, "\n") {
			o.nftLine(n.Name, "add rule ip filter "+FirewallChain+" "+strings.TrimSpace(line))
		}
		if backend != BackendKernelVXLAN {
			continue
		}
		links, err := run(ctx, "", "ip", "-n", n.Netns, "-o", "-d", "link", "show", "type", "vxlan")
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("lab: I2 observer: %w", err)
		}
		for _, line := range strings.Split(links, "\n") {
			o.linkLine(n.Name, line)
		}
		fdb, err := run(ctx, "", "ip", "netns", "exec", n.Netns, "bridge", "-d", "fdb", "show", "dev", kernelDevice)
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("lab: I2 observer: %w", err)
		}
		for _, line := range strings.Split(fdb, "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				// `show dev X` leaves the device out of each line.
				o.fdbLine(n.Name, f[0]+" dev "+kernelDevice+" "+strings.Join(f[1:], " "))
			}
		}
	}
	return o, nil
}

func newI2Observer(to int, backend string, nodes []string) *I2Observer {
	o := &I2Observer{to: to, backend: backend, nodes: nodes, state: map[string]*i2Node{}}
	for _, n := range nodes {
		o.state[n] = &i2Node{rules: map[string]bool{}, links: map[string]i2Link{}, fdbTo: map[string]bool{}, rows: map[string]bool{}}
	}
	return o
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

// update applies change to node's facts under the lock and records an
// event, stamped at, for each fact that changed.
func (o *I2Observer) update(node string, at time.Time, line string, change func(*i2Node)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.state[node]
	if s == nil {
		return
	}
	open, send, listen := s.open, s.send, s.listen
	change(s)
	s.open = len(s.rules) > 0
	for _, f := range []struct {
		was, is bool
		on, off string
	}{{was: open, is: s.open, on: "open", off: "close"}, {was: listen, is: s.listen, on: "listen", off: "unlisten"}, {was: send, is: s.send, on: "flip", off: "unflip"}} {
		if f.was == f.is {
			continue
		}
		kind := f.off
		if f.is {
			kind = f.on
		}
		o.events = append(o.events, I2Event{Node: node, Kind: kind, At: at, Line: line})
	}
}

var nftHandleRE = regexp.MustCompile(`\s*# handle (\d+)$`)

// nftLine: "insert rule ip filter OS_FIREWALL_ALLOW meta l4proto udp ct
// state new udp dport 4889 counter packets 0 bytes 0 accept # handle 7"
// (the agent inserts at the top of the chain; "add rule" for one appended
// by hand), and "delete rule ip filter OS_FIREWALL_ALLOW handle 7".
func (o *I2Observer) nftLine(node, line string) {
	at := time.Now()
	f := strings.Fields(line)
	if len(f) < 6 || f[1] != "rule" || f[4] != FirewallChain {
		return
	}
	switch f[0] {
	case "delete":
		if f[len(f)-2] != "handle" {
			return
		}
		h := f[len(f)-1]
		o.update(node, at, line, func(s *i2Node) { delete(s.rules, h) })
	case "add", "insert":
		h := "start"
		body := line
		if m := nftHandleRE.FindStringSubmatch(line); m != nil {
			h, body = m[1], strings.TrimSuffix(line, m[0])
		}
		if !strings.HasSuffix(body, " accept") || !strings.Contains(body, " udp dport "+strconv.Itoa(o.to)+" ") {
			return
		}
		o.update(node, at, line, func(s *i2Node) { s.rules[h] = true })
	}
}

// ovsdbLine: a CSV row `uuid,new,vxlan0,"{dst_port=""4889"", ...}"` (or
// "initial", "insert", "delete", "old"). Only a tunnel interface carries
// dst_port; vxlan0 is the one the owner's flows send on, any other on the
// port (the staged change's receive port) only receives.
func (o *I2Observer) ovsdbLine(node, line string) {
	at := time.Now()
	f := strings.SplitN(line, ",", 4)
	if len(f) < 3 {
		return
	}
	uuid, action, name := f[0], f[1], f[2]
	opts := ""
	if len(f) == 4 {
		opts = f[3]
	}
	switch action {
	case "new", "initial", "insert":
	case "delete":
		o.update(node, at, line, func(s *i2Node) {
			delete(s.rows, uuid)
			s.listen = len(s.rows) > 0
		})
		return
	default:
		return
	}
	onTo := strings.Contains(opts, `dst_port=""`+strconv.Itoa(o.to)+`""`)
	// OVS's default for a VXLAN tunnel without dst_port is 4789.
	if o.to == 4789 && strings.Contains(opts, "remote_ip=") && !strings.Contains(opts, "dst_port=") {
		onTo = true
	}
	o.update(node, at, line, func(s *i2Node) {
		if onTo {
			s.rows[uuid] = true
		} else {
			delete(s.rows, uuid)
		}
		s.listen = len(s.rows) > 0
		if name == "vxlan0" {
			s.send = onTo
		}
	})
}

// linkRE reads a line of `ip -o -d monitor link` / `ip -o -d link show`:
// "[Deleted ]7: flannel.1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 ...
// vxlan id 1 local 198.18.0.11 dev eth0 srcport 0 0 dstport 4889 ...".
// (dstportRE, rxobserver.go, reads the port).
var linkRE = regexp.MustCompile(`^(Deleted )?(\d+): ([^:@ ]+)(?:@\S+)?: <([^>]*)>`)

func (o *I2Observer) linkLine(node, line string) {
	at := time.Now()
	m := linkRE.FindStringSubmatch(line)
	if m == nil {
		return
	}
	deleted, index, name, flags := m[1] != "", m[2], m[3], m[4]
	pm := dstportRE.FindStringSubmatch(line)
	if pm == nil && !deleted {
		return // not a VXLAN link
	}
	port := 0
	if pm != nil {
		port, _ = strconv.Atoi(pm[1])
	}
	up := false
	for _, fl := range strings.Split(flags, ",") {
		up = up || fl == "UP"
	}
	o.update(node, at, line, func(s *i2Node) {
		if deleted {
			delete(s.links, index)
		} else {
			s.links[index] = i2Link{name: name, up: up, port: port}
		}
		dev, devOnTo := "", false
		s.listen = false
		for i, l := range s.links {
			if l.up && l.port == o.to {
				s.listen = true
			}
			if l.name == kernelDevice {
				dev = i
				devOnTo = l.up && l.port == o.to
			}
		}
		if dev == "" {
			// The old device renamed away, the new one not yet renamed
			// in (a recreation: microseconds): no overlay device, no
			// change of where the node sends until the new one is in.
			return
		}
		if dev != s.devIndex {
			// A new overlay device (a recreation): its remotes are on
			// its own port until an FDB event says otherwise.
			s.devIndex = dev
			clear(s.fdbTo)
		}
		s.send = devOnTo || len(s.fdbTo) > 0
	})
}

// fdbLine: a line of `bridge -d monitor fdb`: "[Deleted ]0a:58:c6:12:00:0c
// dev flannel.1 dst 198.18.0.12 [port 4889] self permanent". The kernel
// prints no port for a remote on the device's own port.
func (o *I2Observer) fdbLine(node, line string) {
	at := time.Now()
	f := strings.Fields(line)
	deleted := len(f) > 0 && f[0] == "Deleted"
	if deleted {
		f = f[1:]
	}
	if len(f) < 3 || f[1] != "dev" || f[2] != kernelDevice {
		return
	}
	var dst string
	port := 0
	for i := 3; i+1 < len(f); i++ {
		switch f[i] {
		case "dst":
			dst = f[i+1]
		case "port":
			port, _ = strconv.Atoi(f[i+1])
		}
	}
	key := f[0] + " " + dst
	o.update(node, at, line, func(s *i2Node) {
		if !deleted && port == o.to {
			s.fdbTo[key] = true
		} else {
			delete(s.fdbTo, key)
		}
		devOnTo := false
		if l, ok := s.links[s.devIndex]; ok {
			devOnTo = l.up && l.port == o.to
		}
		s.send = devOnTo || len(s.fdbTo) > 0
	})
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

// Flipped returns the nodes seen flipping at least once, in node order.
func (o *I2Observer) Flipped() []string {
	seen := map[string]bool{}
	for _, e := range o.Events() {
		if e.Kind == "flip" {
			seen[e.Node] = true
		}
	}
	var out []string
	for _, n := range o.nodes {
		if seen[n] {
			out = append(out, n)
		}
	}
	return out
}

// I2Rules says what CheckWith holds the timeline to.
type I2Rules struct {
	// Staged holds the run to the staged strategy's promise (docs/
	// staged.md, "The invariant"): a node switches its sending only once
	// every node LISTENS on the new port, that is has it open in its
	// firewall and a tunnel up on it. A node may listen early (that is
	// the strategy); what must never happen is a node sending the new
	// port while a peer would drop it. Unset: the atomic strategy's
	// promise (design.md R2): every node has the port open in its
	// firewall before any flips; no node listens on it before its own
	// flip there (the prebuilt device is down), so listening is not asked.
	Staged bool
	// Partial accepts nodes that never flipped: an operation that aborted
	// before its commit (then no node may have flipped at all, and none
	// did if the check passes with no flip), or one rolled back after
	// some nodes flipped. Unset, every node must have flipped and opened:
	// an observer that saw nothing proves nothing about a run that
	// succeeded.
	Partial bool
}

// Check is CheckWith(I2Rules{}): the atomic strategy, every node flipped.
func (o *I2Observer) Check() error { return o.CheckWith(I2Rules{}) }

// CheckWith judges I2 on what was observed. Every flip, the first and any
// later one (a node that flipped back in a rollback and flips again in a
// retry), must find every node open at that instant, and with
// rules.Staged listening too. "Open at that instant" is the opening in
// force then: a node that opened, closed (an abort) and opened again
// counts from its last opening, and one that closed before the flip does
// not count at all. An unflip (a rollback moving a node back) is not
// judged: after it the node no longer sends the new port, and where it
// sends is I1's business. The error lists every violation and the
// timeline.
func (o *I2Observer) CheckWith(rules I2Rules) error {
	ev := o.Events()
	type facts struct{ open, listen, flipped, opened bool }
	st := map[string]*facts{}
	for _, n := range o.nodes {
		st[n] = &facts{}
	}
	var bad []string
	for _, e := range ev {
		f := st[e.Node]
		switch e.Kind {
		case "open":
			f.open, f.opened = true, true
		case "close":
			f.open = false
		case "listen":
			f.listen = true
		case "unlisten":
			f.listen = false
		case "flip":
			f.flipped = true
			for _, n := range o.nodes {
				switch {
				case !st[n].open:
					bad = append(bad, fmt.Sprintf("I2 violated: %s flipped to %d while %s had not opened it", e.Node, o.to, n))
				case rules.Staged && !st[n].listen:
					bad = append(bad, fmt.Sprintf("I2 violated: %s switched sending to %d while %s was not listening on it", e.Node, o.to, n))
				}
			}
		}
	}
	if !rules.Partial {
		for _, n := range o.nodes {
			if !st[n].flipped {
				bad = append(bad, fmt.Sprintf("%s: never seen flipping to %d", n, o.to))
			}
			if !st[n].opened {
				bad = append(bad, fmt.Sprintf("%s: never seen opening %d", n, o.to))
			}
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
		fmt.Fprintf(&b, "  +%-12s %-3s %-8s %s\n", e.At.Sub(t0).Round(time.Microsecond), e.Node, e.Kind, e.Line)
	}
	return b.String()
}

// Summary is the timeline's figures: the lead of the last opening over
// the first flip.
func (o *I2Observer) Summary() string {
	ev := o.Events()
	var lastOpen, firstFlip time.Time
	for _, e := range ev {
		if e.Kind == "flip" && firstFlip.IsZero() {
			firstFlip = e.At
		}
		if e.Kind == "open" && e.At.After(lastOpen) && (firstFlip.IsZero() || e.At.Before(firstFlip)) {
			lastOpen = e.At
		}
	}
	if lastOpen.IsZero() || firstFlip.IsZero() {
		return "no flip or no opening before it: " + strconv.Itoa(len(ev)) + " events"
	}
	return fmt.Sprintf("%d events; last opening %s before the first flip", len(ev), firstFlip.Sub(lastOpen).Round(time.Microsecond))
}
