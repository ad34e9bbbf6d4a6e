//go:build !linux

package probe

import "time"

// pacer is the mesh's wait between ticks where there is no timerfd: a Go
// ticker (pace_linux.go says why Linux has none).
type pacer struct {
	t     *time.Ticker
	woken chan struct{}
}

func newPacer() (*pacer, error) {
	t := time.NewTicker(time.Hour)
	t.Stop()
	return &pacer{t: t, woken: make(chan struct{}, 1)}, nil
}

func (p *pacer) start(d time.Duration) error { p.t.Reset(d); return nil }

func (p *pacer) stop() error { p.t.Stop(); return nil }

func (p *pacer) wake() {
	select {
	case p.woken <- struct{}{}:
	default:
	}
}

func (p *pacer) wait() (uint64, error) {
	select {
	case <-p.t.C:
		return 1, nil
	case <-p.woken:
		return 0, nil
	}
}

func (p *pacer) close() error { p.t.Stop(); return nil }
