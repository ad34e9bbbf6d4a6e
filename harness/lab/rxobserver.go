package lab

import (
	"bufio"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/pathprobe"
	"golang.org/x/sys/unix"
)

// RxObserver watches the staged strategy's invariant from outside the
// product: at every moment every node receives on every port any node
// sends on (docs/staged.md). It trusts neither the coordinator nor the
// agents. Per node it runs:
//
//   - a receive-set monitor pushed by the node's own dataplane and
//     stamped on receipt: on OVS `ovsdb-client monitor` of the Interface
//     table (every vxlan interface and its dst_port), on kernel VXLAN
//     `ip -d monitor link` (every VXLAN link, up or not, and its dstport);
//   - a packet capture on the node's underlay interface (eth0) of the
//     VXLAN frames arriving on either port, stamped on receipt.
//
// Check: every frame that reached node Y on port P found Y receiving on P.
// The underlay path check's own frames (inner destination MAC
// pathprobe.InnerDstMAC) are not overlay traffic and are left out.
//
// Timing: a monitor's stamp comes a scheduling delay after the change, so
// a receiver's start is seen late (a frame in the first RxGrace of a
// listen counts as received: the staged strategy sends nothing on a port
// until every node listened, hundreds of ms earlier), and its end is seen
// late too (a frame inside that delay after a receiver went is missed, not
// falsely blamed). Any old-port frame to a node that retired the old port
// counts, on both backends (an earlier OVS layout sent a redundant copy on
// the old port during its retirement, which this observer let pass).
type RxObserver struct {
	backend  string
	from, to int

	mu       sync.Mutex
	rx       map[string][]rxChange // node -> receive-set changes, in order
	frames   []rxFrame
	procs    []*exec.Cmd
	caps     []int // packet socket fds
	stop     chan struct{}
	wg       sync.WaitGroup
	underlay map[string]string // underlay IP -> node
	// readyAt is when every monitor had printed its node's initial state:
	// frames captured before it (the captures start with the monitors)
	// precede what the observer can judge, and the operation.
	readyAt time.Time
}

// RxGrace is how long before a receiver's stamped start a frame still
// counts as received (the monitors' delay).
const RxGrace = 50 * time.Millisecond

type rxChange struct {
	at    time.Time
	ports map[int]bool // the node's receive set from then on
}

type rxFrame struct {
	node, from string
	port       int
	at         time.Time
}

// ObserveReceiveBoth starts the monitors and captures on every node and
// returns once each monitor printed the node's initial state.
func (l *Lab) ObserveReceiveBoth(from, to int) (*RxObserver, error) {
	o := &RxObserver{backend: l.cfg().Backend, from: from, to: to, rx: map[string][]rxChange{}, stop: make(chan struct{}), underlay: map[string]string{}}
	ready := make(chan string, 2*len(l.Nodes()))
	for _, n := range l.Nodes() {
		o.underlay[n.UnderlayIP.String()] = n.Name
	}
	for _, n := range l.Nodes() {
		var cmd *exec.Cmd
		var k *kernelLinks
		if o.backend == BackendOVS {
			cmd = exec.Command("ovsdb-client", "monitor", "unix:"+n.OVSDBSock, "Open_vSwitch", "Interface", "name,type,options", "--format=csv")
		} else {
			// ip monitor prints nothing until a change: the links are
			// read once first (a change in between is not expected: the
			// observer starts before the operation).
			out, err := exec.Command("ip", "netns", "exec", n.Netns, "ip", "-d", "link", "show", "type", "vxlan").Output()
			if err != nil {
				o.Stop()
				return nil, fmt.Errorf("lab: rx observer: %w", err)
			}
			k = &kernelLinks{links: map[string]kernelLink{}}
			k.feed(string(out))
			o.note(n.Name, k.ports())
			ready <- n.Name
			cmd = exec.Command("ip", "netns", "exec", n.Netns, "ip", "-d", "monitor", "link")
		}
		if err := o.startMonitor(n.Name, cmd, ready, k); err != nil {
			o.Stop()
			return nil, err
		}
		if err := o.startCapture(n); err != nil {
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
			return nil, errors.New("lab: rx observer: a monitor printed nothing within 10 s")
		}
	}
	o.mu.Lock()
	o.readyAt = time.Now()
	o.mu.Unlock()
	return o, nil
}

// amendFirst replaces node's first receive set (the initial dump, still
// being read) by ports.
func (o *RxObserver) amendFirst(node string, ports map[int]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if chs := o.rx[node]; len(chs) > 0 {
		chs[0].ports = ports
	}
}

func (o *RxObserver) note(node string, ports map[int]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rx[node] = append(o.rx[node], rxChange{at: time.Now(), ports: ports})
}

func (o *RxObserver) startMonitor(node string, cmd *exec.Cmd, ready chan<- string, k *kernelLinks) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lab: rx observer: start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	o.mu.Lock()
	o.procs = append(o.procs, cmd)
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		if o.backend == BackendOVS {
			o.readOVS(node, sc, ready)
		} else {
			o.readKernel(node, sc, k)
		}
		_ = cmd.Wait()
	}()
	return nil
}

// readOVS follows ovsdb-client's CSV: a header naming the columns, then
// one row per change (initial, insert, delete, old, new).
func (o *RxObserver) readOVS(node string, sc *bufio.Scanner, ready chan<- string) {
	ifaces := map[string]int{} // row uuid -> dst_port of a vxlan interface
	var col map[string]int
	sent := false
	for sc.Scan() {
		rec, err := csv.NewReader(strings.NewReader(sc.Text())).Read()
		if err != nil || len(rec) < 2 {
			continue
		}
		if rec[0] == "row" {
			col = map[string]int{}
			for i, c := range rec {
				col[c] = i
			}
			continue
		}
		if col == nil {
			continue
		}
		row, action := rec[0], rec[1]
		switch action {
		case "initial", "insert", "new":
			if rec[col["type"]] != "vxlan" {
				delete(ifaces, row)
				break
			}
			port := 4789
			if m := dstPortRE.FindStringSubmatch(rec[col["options"]]); m != nil {
				port, _ = strconv.Atoi(m[1])
			}
			ifaces[row] = port
		case "delete":
			delete(ifaces, row)
		default:
			continue
		}
		ports := map[int]bool{}
		for _, p := range ifaces {
			ports[p] = true
		}
		// The initial rows are one state printed row by row (br0, eth0,
		// vxlan0, ...): they complete the first entry rather than add
		// states that never were (an empty receive set before vxlan0's
		// row, judged against frames that arrived meanwhile).
		if action == "initial" && sent {
			o.amendFirst(node, ports)
		} else {
			o.note(node, ports)
		}
		if !sent {
			sent = true
			ready <- node
		}
	}
}

var dstPortRE = regexp.MustCompile(`dst_port="*(\d+)`)

type kernelLink struct {
	up   bool
	port int
}

type kernelLinks struct{ links map[string]kernelLink } // by ifindex

var (
	linkHeadRE = regexp.MustCompile(`^(Deleted )?(\d+): [^:]+: <([^>]*)>`)
	dstportRE  = regexp.MustCompile(`\bvxlan id \d+ .*\bdstport (\d+)`)
)

// feed applies `ip -d link` / `ip -d monitor link` text.
func (k *kernelLinks) feed(text string) {
	var cur string
	var deleted bool
	var up bool
	for _, line := range strings.Split(text, "\n") {
		if m := linkHeadRE.FindStringSubmatch(line); m != nil {
			cur, deleted = m[2], m[1] != ""
			up = strings.Contains(","+m[3]+",", ",UP,")
			if deleted {
				delete(k.links, cur)
			}
			continue
		}
		if m := dstportRE.FindStringSubmatch(line); m != nil && cur != "" && !deleted {
			p, _ := strconv.Atoi(m[1])
			k.links[cur] = kernelLink{up: up, port: p}
		}
	}
}

func (k *kernelLinks) ports() map[int]bool {
	out := map[int]bool{}
	for _, l := range k.links {
		if l.up {
			out[l.port] = true
		}
	}
	return out
}

// readKernel feeds each monitor record (a head line and its indented
// lines) as it completes.
func (o *RxObserver) readKernel(node string, sc *bufio.Scanner, k *kernelLinks) {
	var rec []string
	flush := func() {
		if len(rec) == 0 {
			return
		}
		k.feed(strings.Join(rec, "\n"))
		rec = nil
		o.note(node, k.ports())
	}
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") {
			flush()
		}
		rec = append(rec, line)
		if strings.Contains(line, "dstport") {
			flush()
		}
	}
	flush()
}

// startCapture opens a packet socket on the node's eth0 for inbound UDP to
// either port and reads it until Stop.
func (o *RxObserver) startCapture(n Node) error {
	var fd int
	err := netns.Do(n.Netns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
			_ = unix.Close(fd)
			return err
		}
		tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		return fmt.Errorf("lab: rx observer: capture on %s: %w", n.Name, err)
	}
	o.mu.Lock()
	o.caps = append(o.caps, fd)
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		buf := make([]byte, 2048)
		innerDst := pathprobe.InnerDstMAC()
		for {
			select {
			case <-o.stop:
				return
			default:
			}
			nr, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			p := buf[:nr]
			if len(p) < 20+8+8+6 || p[9] != 17 {
				continue
			}
			ihl := int(p[0]&0x0f) * 4
			if len(p) < ihl+8+8+6 {
				continue
			}
			port := int(binary.BigEndian.Uint16(p[ihl+2:]))
			if port != o.from && port != o.to {
				continue
			}
			if [6]byte(p[ihl+16:ihl+22]) == innerDst {
				continue // the path check's frames
			}
			src := net.IP(p[12:16]).String()
			o.mu.Lock()
			o.frames = append(o.frames, rxFrame{node: n.Name, from: o.underlay[src], port: port, at: time.Now()})
			o.mu.Unlock()
		}
	}()
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Stop ends the monitors (by PID) and the captures.
func (o *RxObserver) Stop() {
	o.mu.Lock()
	procs, caps := o.procs, o.caps
	o.procs, o.caps = nil, nil
	o.mu.Unlock()
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	for _, c := range procs {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
	o.wg.Wait()
	for _, fd := range caps {
		_ = unix.Close(fd)
	}
}

// receiving reports whether node received on port at t: the receive set
// last stamped at or before t holds it, or one stamped within RxGrace
// after t does (a start seen late).
func (o *RxObserver) receiving(node string, port int, t time.Time) bool {
	var cur map[int]bool
	for _, c := range o.rx[node] {
		if c.at.After(t) {
			if c.at.After(t.Add(RxGrace)) {
				break
			}
			if c.ports[port] {
				return true
			}
			continue
		}
		cur = c.ports
	}
	return cur[port]
}

// around places f among its node's receive-set changes: the change before
// it and the one after, each with its distance, so that a violation says
// whether the receiver was seen starting a moment later (a monitor late)
// or not at all.
func (o *RxObserver) around(f rxFrame) string {
	var before, after *rxChange
	for i := range o.rx[f.node] {
		c := &o.rx[f.node][i]
		if c.at.After(f.at) {
			after = c
			break
		}
		before = c
	}
	set := func(c *rxChange) string {
		var ps []int
		for p, on := range c.ports {
			if on {
				ps = append(ps, p)
			}
		}
		sort.Ints(ps)
		return fmt.Sprint(ps)
	}
	out := "arrived"
	if before != nil {
		out += fmt.Sprintf(" %s after the receive set became %s", f.at.Sub(before.at).Round(time.Microsecond), set(before))
	}
	if after != nil {
		out += fmt.Sprintf(", %s before it became %s", after.at.Sub(f.at).Round(time.Microsecond), set(after))
	}
	return out
}

// RxSummary is what an RxObserver saw.
type RxSummary struct {
	Frames     map[int]int // by port
	Violations []string
}

// Check judges the invariant on what was observed. It also fails when no
// frame was seen on either port (an observer that saw nothing proves
// nothing).
func (o *RxObserver) Check() (RxSummary, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := RxSummary{Frames: map[int]int{}}
	bad := map[string]int{}
	first := map[string]rxFrame{}
	for _, f := range o.frames {
		if f.at.Before(o.readyAt) {
			continue
		}
		s.Frames[f.port]++
		if o.receiving(f.node, f.port, f.at) {
			continue
		}
		k := fmt.Sprintf("%s→%s on %d", f.from, f.node, f.port)
		if bad[k] == 0 {
			first[k] = f
		}
		bad[k]++
	}
	for k, n := range bad {
		s.Violations = append(s.Violations, fmt.Sprintf("%s: %d frame(s) reached a node not receiving on that port (the first %s)", k, n, o.around(first[k])))
	}
	sort.Strings(s.Violations)
	switch {
	case s.Frames[o.from]+s.Frames[o.to] == 0:
		return s, errors.New("rx observer: no VXLAN frame seen on either port: it proves nothing")
	case len(s.Violations) > 0:
		return s, fmt.Errorf("receive-both broken: %s", strings.Join(s.Violations, "; "))
	}
	return s, nil
}
