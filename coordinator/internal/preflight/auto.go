package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Answer is one node's answer to a preflight round.
type Answer struct {
	Preflight *agentv1.PreflightResponse
	Err       error
	Took      time.Duration // from the round's start: the fan-out's cost (Result.Round)
}

// ResolveAuto settles strategy "auto": staged when every node's agent
// accepts it (its staged preflight finds no problem) and says staged loses
// less there (PreflightResponse.staged_loses_less: the lab's figures for
// its backend as configured), else atomic, with why in StrategyReason.
//
// It is the preflight's one round of Preflight calls, with strategy
// staged: each answer also carries the atomic judgement
// (PreflightResponse.atomic), so the preflight that follows (Full) reads
// r.Answers instead of asking again. An unreachable node counts against
// staged: the atomic preflight then names it, without asking it again.
func (c *Checker) ResolveAuto(ctx context.Context, r Request) Request {
	if !r.Auto {
		return r
	}
	answers := map[string]Answer{}
	var mu sync.Mutex
	start := time.Now()
	fleet.FanOut(r.Nodes, func(n string) {
		cctx, cancel := context.WithTimeout(ctx, r.Step)
		defer cancel()
		pf, err := c.fleet.Agent(n).Client.Preflight(cctx, &agentv1.PreflightRequest{OperationId: r.ID, TargetPort: r.To.Wire(), Strategy: model.StrategyStaged})
		took := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		answers[n] = Answer{pf, err, took}
	})
	// Nodes are grouped by what they said: 10,000 nodes of one backend
	// give one reason, not 10,000.
	against, why := map[string][]string{}, map[string][]string{}
	count := 0
	for _, n := range r.Nodes {
		a := answers[n]
		switch {
		case a.Err != nil:
			k := "not answered: " + status.Convert(a.Err).Message()
			against[k] = append(against[k], n)
		case len(a.Preflight.GetProblems()) > 0:
			against[a.Preflight.GetProblems()[0]] = append(against[a.Preflight.GetProblems()[0]], n)
		case !a.Preflight.GetStagedLosesLess():
			note := a.Preflight.GetStrategyNote()
			if note == "" {
				note = "an agent older than strategy auto"
			}
			against[note] = append(against[note], n)
		default:
			why[a.Preflight.GetStrategyNote()] = append(why[a.Preflight.GetStrategyNote()], n)
			continue
		}
		count++
	}
	grouped := func(m map[string][]string) string {
		var parts []string
		for _, note := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%s (%s)", note, model.Abbreviate(m[note], 5)))
		}
		if len(parts) > 3 {
			parts = append(parts[:3], fmt.Sprintf("… (%d more reasons)", len(parts)-3))
		}
		return strings.Join(parts, "; ")
	}
	if count == 0 {
		r.Answers = answers
		r.StrategyReason = fmt.Sprintf("%s: staged, every node accepts it and loses less with it: %s", r.AutoName(), grouped(why))
		return r
	}
	r = r.asAtomic()
	r.Answers = atomicAnswers(answers)
	r.StrategyReason = fmt.Sprintf("%s: atomic, staged does not lose less on %d of %d node(s): %s", r.AutoName(), count, len(r.Nodes), grouped(against))
	return r
}

// atomicAnswers are the staged round's answers as the atomic preflight
// would give them. A node missing from them is asked again with strategy
// atomic, that node alone: one that answered with an error (an agent
// older than the staged strategy refuses its name), and one older than
// PreflightResponse.atomic, whose answer says nothing of the atomic
// problems and actions. A node that did not answer at all (unavailable,
// or its deadline passed) keeps its error: the preflight counts it
// unreachable without a second wait of up to a step.
func atomicAnswers(staged map[string]Answer) map[string]Answer {
	out := map[string]Answer{}
	for n, a := range staged {
		switch {
		case a.Err != nil:
			if code := status.Code(a.Err); code == codes.Unavailable || code == codes.DeadlineExceeded {
				out[n] = a
			}
		case a.Preflight.GetAtomic() != nil:
			pf := proto.Clone(a.Preflight).(*agentv1.PreflightResponse)
			pf.Problems, pf.Actions, pf.Atomic = pf.Atomic.Problems, pf.Atomic.Actions, nil
			out[n] = Answer{pf, nil, a.Took}
		}
	}
	return out
}

// AutoName is how a reason names auto: asked for, or the default.
func (r Request) AutoName() string {
	if r.ByDefault {
		return "auto (the coordinator's --default-strategy)"
	}
	return "auto"
}
