package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cutover-dev/cutover/pkg/netns"
	"github.com/cutover-dev/cutover/pkg/pki"
	agentv1 "github.com/cutover-dev/cutover/proto/agent/v1"
)

// PairStats is one ordered pair's probe figures: From probes To.
type PairStats struct {
	From, To   string
	Sent, Lost uint64
	LongestGap time.Duration
	// FromStall is how far From's agent fell behind its own probe mesh
	// over the same span (ProbeStatsResponse.max_stall_micros).
	FromStall time.Duration
}

// Disruption sums pair figures the way the cutover report does.
type Disruption struct {
	Pairs      []PairStats
	Sent, Lost uint64
	LongestGap time.Duration
	// MaxPairLost is the most probes one pair lost.
	MaxPairLost uint64
}

// Summarize totals pairs.
func Summarize(pairs []PairStats) Disruption {
	d := Disruption{Pairs: pairs}
	for _, p := range pairs {
		d.Sent += p.Sent
		d.Lost += p.Lost
		d.LongestGap = max(d.LongestGap, p.LongestGap)
		d.MaxPairLost = max(d.MaxPairLost, p.Lost)
	}
	return d
}

// String is a one-line summary.
func (d Disruption) String() string {
	return fmt.Sprintf("%d pairs: %d/%d probes lost, at most %d per pair, longest gap %s",
		len(d.Pairs), d.Lost, d.Sent, d.MaxPairLost, d.LongestGap.Round(10*time.Microsecond))
}

// ProbeStats reads every agent's probe mesh counters over the agents' own
// gRPC API (with the coordinator's identity from the lab PKI, from the hub
// namespace), and with reset zeroes them after reading, as the coordinator
// does around an operation. The benchmark's baselines, which change ports
// behind the agents' backs, measure their disruption with it.
func (l *Lab) ProbeStats(ctx context.Context, reset bool) ([]PairStats, error) {
	if l.PKIDir() == "" && !l.cfg().Insecure {
		return nil, errors.New("lab: ProbeStats: the lab runs no agents (Config.StartProcesses)")
	}
	creds := insecure.NewCredentials()
	if !l.cfg().Insecure {
		tc, err := pki.ClientConfig(pki.CoordinatorFiles(l.PKIDir()), pki.RoleAgent)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	hub := HubNetns(l.cfg().Name)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(hub, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		pairs []PairStats
		errs  []error
	)
	for _, n := range l.Nodes() {
		wg.Go(func() {
			ps, err := probeStatsOf(ctx, n, creds, dial, reset)
			mu.Lock()
			defer mu.Unlock()
			pairs = append(pairs, ps...)
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: probe stats: %w", n.Name, err))
			}
		})
	}
	wg.Wait()
	slices.SortFunc(pairs, func(a, b PairStats) int {
		if c := strings.Compare(a.From, b.From); c != 0 {
			return c
		}
		return strings.Compare(a.To, b.To)
	})
	return pairs, errors.Join(errs...)
}

func probeStatsOf(ctx context.Context, n Node, creds credentials.TransportCredentials, dial func(context.Context, string) (net.Conn, error), reset bool) ([]PairStats, error) {
	conn, err := grpc.NewClient("passthrough:///"+n.AgentAddr, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(dial))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	r, err := agentv1.NewAgentServiceClient(conn).ProbeStats(ctx, &agentv1.ProbeStatsRequest{Reset_: reset})
	if err != nil {
		return nil, err
	}
	var out []PairStats
	for _, p := range r.GetPeers() {
		out = append(out, PairStats{From: n.Name, To: p.GetPeer(), Sent: p.GetSent(), Lost: p.GetLost(), LongestGap: time.Duration(p.GetLongestGapMicros()) * time.Microsecond,
			FromStall: time.Duration(r.GetMaxStallMicros()) * time.Microsecond})
	}
	return out, nil
}
