package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// progress shows an operation's events as they arrive. Operation-wide
// events, failures and anything unusual are one line each; the plain "this
// node answered ok" of every node is not (200 nodes would be 1,000 lines):
// each step ends with one summary line instead, done/total and the
// slowest node. On a terminal a live line under them shows the step in
// flight: how many answered, and who is still awaited.
type progress struct {
	w    io.Writer
	tty  bool
	step *stepProgress
	live bool // the live line is on the screen (tty)
}

// stepProgress is one step sent to nodes (one attempt of it).
type stepProgress struct {
	phase  string
	start  int64
	nodes  []string
	done   map[string]int64 // answer instant (coordinator clock)
	failed int
	last   string // answered last so far
	ended  bool   // summarized
}

func newProgress(w io.Writer, tty bool) *progress { return &progress{w: w, tty: tty} }

func (p *progress) event(e *coordinatorv1.OperationEvent) {
	p.clearLive()
	s := p.step
	switch {
	case len(e.GetStepNodes()) > 0:
		p.endStep()
		p.line(eventLine(e))
		p.step = &stepProgress{phase: e.GetPhase(), start: e.GetUnixNano(), nodes: e.GetStepNodes(), done: map[string]int64{}}
	case e.GetNodeDone() && s != nil && !s.ended && e.GetPhase() == s.phase && slices.Contains(s.nodes, e.GetNode()):
		if _, seen := s.done[e.GetNode()]; !seen {
			s.done[e.GetNode()] = e.GetUnixNano()
			s.last = e.GetNode()
			if e.GetFailed() {
				s.failed++
			}
		}
		if e.GetFailed() || e.GetMessage() != e.GetPhase()+": ok" {
			p.line(eventLine(e))
		}
		if len(s.done) == len(s.nodes) {
			p.endStep()
		}
	default:
		if s != nil && e.GetNode() == "" && e.GetPhase() != s.phase {
			// The operation moved on (done, a rollback asked): the step's
			// tally comes before what follows it.
			p.endStep()
		}
		p.line(eventLine(e))
	}
	p.drawLive()
}

// finish ends the output before the final report.
func (p *progress) finish() {
	p.clearLive()
	p.endStep()
}

func (p *progress) line(s string) { _, _ = fmt.Fprintln(p.w, s) }

// endStep prints the summary of the step in flight, once.
func (p *progress) endStep() {
	s := p.step
	if s == nil || s.ended {
		return
	}
	s.ended = true
	p.line(s.summary())
}

func (s *stepProgress) summary() string {
	res := "ok"
	if s.failed > 0 || len(s.done) < len(s.nodes) {
		res = "FAILED"
	}
	at := s.start
	for _, t := range s.done {
		at = max(at, t)
	}
	msg := fmt.Sprintf("%d/%d answered", len(s.done), len(s.nodes))
	if s.failed > 0 {
		msg += fmt.Sprintf(" (%d failed)", s.failed)
	}
	if len(s.done) > 0 {
		msg += fmt.Sprintf(" in %s ms; slowest %s (%s ms)", fmtMillis(at-s.start), s.last, fmtMillis(s.done[s.last]-s.start))
	}
	if w := s.waiting(); len(w) > 0 {
		msg += "; no answer from " + listSome(w, 5)
	}
	return eventLine(&coordinatorv1.OperationEvent{Phase: s.phase, UnixNano: at, Message: msg, Failed: res != "ok"})
}

func (s *stepProgress) waiting() []string {
	var w []string
	for _, n := range s.nodes {
		if _, ok := s.done[n]; !ok {
			w = append(w, n)
		}
	}
	return w
}

// listSome joins up to n names and says how many more there are.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s (+%d more)", strings.Join(names[:n], ", "), len(names)-n)
}

// drawLive writes the live line of the step in flight (tty only), with no
// newline: the next event clears it.
func (p *progress) drawLive() {
	s := p.step
	if !p.tty || s == nil || s.ended {
		return
	}
	msg := fmt.Sprintf("  %s: %d/%d answered", s.phase, len(s.done), len(s.nodes))
	if s.failed > 0 {
		msg += fmt.Sprintf(" (%d failed)", s.failed)
	}
	if s.start != 0 {
		msg += fmt.Sprintf(", %s s", fmtSeconds(time.Since(time.Unix(0, s.start))))
	}
	msg += "; waiting on " + listSome(s.waiting(), 3)
	_, _ = io.WriteString(p.w, clip(msg, planWidth))
	p.live = true
}

func (p *progress) clearLive() {
	if p.live {
		_, _ = io.WriteString(p.w, "\r\x1b[K")
		p.live = false
	}
}

func fmtSeconds(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return fmt.Sprintf("%.1f", d.Seconds())
}
