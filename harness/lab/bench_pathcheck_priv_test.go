package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/lab/labtest"
	"github.com/cutover-dev/cutover/harness/testenv"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

type pathFigure struct {
	Backend      string               `json:"backend"`
	Nodes        int                  `json:"nodes"`
	Sampling     string               `json:"sampling"`
	PairsChecked uint32               `json:"pairs_checked"`
	Frames       int                  `json:"frames_per_pair_round"` // VNIs × sizes
	WindowMS     float64              `json:"window_ms"`             // the coordinator's --path-check-window
	Check        benchresult.MsStats  `json:"check_ms"`              // coordinator side: Info already done, PathCheck fan-out and judging
	Lead         benchresult.MsStats  `json:"lead_ms"`               // the start lead (part of check)
	Exchange     benchresult.MsStats  `json:"exchange_ms"`           // start instant to the last agent's answer: ends early when every frame passed
	Coordctl     benchresult.MsStats  `json:"coordctl_ms"`           // coordctl pathcheck, process start to exit
	Runs         int                  `json:"runs"`
	Problems     int                  `json:"problems"`
	Plan         *benchresult.MsStats `json:"plan_ms,omitempty"` // coordctl plan (whole preflight with the check)
}

// BenchmarkPathCheck measures the underlay path check (coordctl pathcheck
// --port 4889, 5 runs) on a clean lab underlay for N = 8 and 32
// (COT_PATH_BENCH_SIZES) on both backends (COT_PATH_BENCH_BACKENDS), with
// the coordinator's --path-check-window COT_PATH_BENCH_WINDOW (400ms, the
// default), and a whole plan with it. Writes results/path_check.json.
func BenchmarkPathCheck(b *testing.B) {
	testenv.RequirePrivileged(b, append(ovsBins, "go")...)
	bin := labtest.Binaries(b)
	sizes := strings.Split(envOr("COT_PATH_BENCH_SIZES", "8,32"), ",")
	backends := strings.Split(envOr("COT_PATH_BENCH_BACKENDS", lab.BackendOVS+","+lab.BackendKernelVXLAN), ",")
	window := envDur("COT_PATH_BENCH_WINDOW", 400*time.Millisecond)
	var figs []pathFigure
	for _, backend := range backends {
		for _, s := range sizes {
			n, err := strconv.Atoi(s)
			if err != nil {
				b.Fatalf("COT_PATH_BENCH_SIZES: %q: %v", s, err)
			}
			b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
				for b.Loop() {
					figs = append(figs, benchPath(b, bin, backend, n, window))
				}
			})
		}
	}
	benchresult.Save(b, "path_check.json", figs)
}

func benchPath(b *testing.B, bin, backend string, n int, window time.Duration) pathFigure {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(d)
	cfg := lab.Config{
		Name: fmt.Sprintf("p%d", os.Getpid()%100000), Nodes: n, Backend: backend, Dir: filepath.Join(d, "lab"),
		StartProcesses: true, AgentBin: filepath.Join(bin, "agent"), CoordinatorBin: filepath.Join(bin, "coordinator"),
		ExtraCoordinatorArgs: []string{"--path-check-window", window.String()},
	}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Down(context.Background()); err != nil {
			b.Error(err)
		}
	}()
	coordctl := func(args ...string) ([]byte, time.Duration) {
		cmd, err := l.CoordctlCommand(ctx, filepath.Join(bin, "coordctl"), args...)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		out, err := cmd.Output()
		took := time.Since(t0)
		if err != nil {
			b.Fatalf("coordctl %v: %v\n%s", args, err, out)
		}
		return out, took
	}
	f := pathFigure{Backend: backend, Nodes: n, WindowMS: float64(window.Milliseconds())}
	var checks, walls, leads, exchanges []time.Duration
	for range 5 {
		out, wall := coordctl("pathcheck", "--port", "4889", "-o", "json")
		res := &coordinatorv1.PathCheckResult{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(out, res); err != nil {
			b.Fatalf("result: %v\n%s", err, out)
		}
		f.Sampling, f.PairsChecked, f.Frames = res.Sampling, res.PairsChecked, (len(res.Vnis)+1)*len(res.Sizes)
		f.Problems += len(res.Problems)
		checks = append(checks, time.Duration(res.TookMicros)*time.Microsecond)
		leads = append(leads, time.Duration(res.LeadMicros)*time.Microsecond)
		exchanges = append(exchanges, time.Duration(res.ExchangeMicros)*time.Microsecond)
		walls = append(walls, wall)
	}
	f.Runs, f.Check, f.Coordctl = len(checks), benchresult.Ms(checks), benchresult.Ms(walls)
	f.Lead, f.Exchange = benchresult.Ms(leads), benchresult.Ms(exchanges)
	// The median: a run where an answer was lost twice may hold one
	// agent's window; a check that never ends early holds every run's.
	if f.Exchange.MedianMs >= f.WindowMS {
		b.Errorf("%s N=%d: the clean underlay's exchange took %.0f ms (median), the whole %.0f ms window: the agents did not end when every frame had passed", backend, n, f.Exchange.MedianMs, f.WindowMS)
	}
	_, plan := coordctl("plan", "--port", "4889")
	p := benchresult.Ms([]time.Duration{plan})
	f.Plan = &p
	if f.Problems > 0 {
		b.Errorf("%s N=%d: the clean lab underlay had %d path problem(s)", backend, n, f.Problems)
	}
	b.Logf("%s N=%d (%s): %d directions, check %.0f ms median (max %.0f; start lead %.0f, exchange %.0f median, max %.0f), coordctl pathcheck %.0f ms median, plan %.0f ms",
		backend, n, f.Sampling, f.PairsChecked, f.Check.MedianMs, f.Check.MaxMs, f.Lead.MedianMs, f.Exchange.MedianMs, f.Exchange.MaxMs, f.Coordctl.MedianMs, plan.Seconds()*1000)
	return f
}
