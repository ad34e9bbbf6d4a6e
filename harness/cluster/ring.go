package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/pkg/netns"
)

// Ring is a ping from every node to the next one's pod gateway across the
// overlay: the traffic a cutover must carry, measured apart from Cutover's
// own probe mesh.
type Ring struct {
	pairs []*ringPair
}

type ringPair struct {
	from, to string
	cmd      *exec.Cmd
	out      bytes.Buffer
	done     chan struct{} // closed once Wait returned
}

// RingPair is one direction's count.
type RingPair struct {
	From, To       string
	Sent, Received int
}

// Lost is Sent minus Received.
func (p RingPair) Lost() int { return p.Sent - p.Received }

// StartRing starts the ring, one ping every interval per pair.
func (c *Cluster) StartRing(interval time.Duration) (*Ring, error) {
	r := &Ring{}
	for i, n := range c.Nodes {
		to := c.Nodes[(i+1)%len(c.Nodes)]
		if to == n {
			break
		}
		if err := r.start(n.Name, to.Name, []string{"nsenter", "--net=" + filepath.Join(netns.Dir, n.Netns), "--"},
			"-q", interval, GatewayIP(to.Index).String()); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// start adds a pair to the ring: ping (with flag, "-q" for its statistics
// only or "" for a line per reply) to addr every interval, run through
// prefix (the namespaces it pings from). On error it stops the ring.
func (r *Ring) start(from, to string, prefix []string, flag string, interval time.Duration, addr string) error {
	argv := append(prefix, "ping", "-n", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "-W", "1")
	if flag != "" {
		argv = append(argv, flag)
	}
	p := &ringPair{from: from, to: to, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], append(argv[1:], addr)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_, _ = r.Stop()
		return err
	}
	go func() {
		_ = p.cmd.Wait() // ping exits non-zero when a reply was missed
		close(p.done)
	}()
	r.pairs = append(r.pairs, p)
	return nil
}

var pingStatsRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// halt ends every ping with SIGINT, so that it prints its statistics
// (SIGKILL after 5 s), and waits for it.
func (r *Ring) halt() {
	for _, p := range r.pairs {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// Stop ends every ping (SIGINT, so it prints its statistics) and returns
// the counts.
func (r *Ring) Stop() ([]RingPair, error) {
	r.halt()
	var out []RingPair
	var errs []error
	for _, p := range r.pairs {
		m := pingStatsRE.FindStringSubmatch(p.out.String())
		if m == nil {
			errs = append(errs, fmt.Errorf("ring %s->%s: no statistics in %q", p.from, p.to, strings.TrimSpace(p.out.String())))
			continue
		}
		sent, _ := strconv.Atoi(m[1])
		recv, _ := strconv.Atoi(m[2])
		out = append(out, RingPair{From: p.from, To: p.to, Sent: sent, Received: recv})
	}
	return out, errors.Join(errs...)
}
