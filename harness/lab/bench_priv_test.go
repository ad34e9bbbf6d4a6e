package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/benchresult"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/harness/testenv"
)

type upFigure struct {
	Backend string  `json:"backend"`
	Nodes   int     `json:"nodes"`
	UpS     float64 `json:"up_s"`
	MeshS   float64 `json:"mesh_s"` // first full-mesh overlay check, includes ARP warm-up
	DownS   float64 `json:"down_s"`
}

// BenchmarkUp measures lab bring-up, first full-mesh reachability and
// tear-down for several sizes, and writes results/lab-up.json.
func BenchmarkUp(b *testing.B) {
	testenv.RequirePrivileged(b, ovsBins...)
	var figs []upFigure
	for _, backend := range []string{lab.BackendOVS, lab.BackendKernelVXLAN} {
		for _, n := range []int{8, 32} {
			b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
				for b.Loop() {
					figs = append(figs, measureUp(b, backend, n))
				}
			})
		}
	}
	benchresult.Save(b, "lab-up.json", figs)
}

func measureUp(b *testing.B, backend string, n int) upFigure {
	ctx := context.Background()
	d, err := os.MkdirTemp("", "cot-lab-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(d)
	cfg := lab.Config{Name: fmt.Sprintf("b%d", os.Getpid()%100000), Nodes: n, Backend: backend, Dir: filepath.Join(d, "lab")}
	t0 := time.Now()
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	up := time.Since(t0)
	t1 := time.Now()
	m, err := l.Mesh(ctx, 10*time.Second)
	mesh := time.Since(t1)
	if err == nil && !m.AllOK() {
		err = fmt.Errorf("mesh:\n%s", m)
	}
	t2 := time.Now()
	if derr := l.Down(ctx); derr != nil {
		b.Fatal(derr)
	}
	down := time.Since(t2)
	if err != nil {
		b.Fatal(err)
	}
	f := upFigure{backend, n, up.Seconds(), mesh.Seconds(), down.Seconds()}
	b.Logf("%s N=%d: up %s, first full mesh %s, down %s", backend, n, up.Round(time.Millisecond), mesh.Round(time.Millisecond), down.Round(time.Millisecond))
	return f
}
