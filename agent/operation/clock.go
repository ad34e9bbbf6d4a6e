package operation

import (
	"runtime"
	"sort"
	"sync"
	"time"
)

// Clock is the machine's only source of time, so that unit tests run the
// dead-man, the prepare timeout and scheduled commits without real sleeps.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
	// SleepUntil returns at (or just after) at, as measured by Now, and
	// reports how late it returned.
	SleepUntil(at time.Time) time.Duration
}

// Timer is what AfterFunc returns.
type Timer interface {
	// Stop reports whether it stopped the timer before it fired.
	Stop() bool
}

// RealClock is the wall clock of the node.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc implements Clock.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// SleepUntil implements Clock with PreciseSleepUntil.
func (RealClock) SleepUntil(at time.Time) time.Duration { return PreciseSleepUntil(at) }

// spinWindow is how long before the instant PreciseSleepUntil stops trusting
// the runtime timer (whose wake-up can be a millisecond late on a busy node)
// and spins instead.
const spinWindow = 2 * time.Millisecond

// timerfdSpin is the spin left where a timerfd wakes the sleep
// (sleepUntilWall): it fired 150 µs late at the median, 190 at the 90th
// percentile, on the lab's 2-core machine.
const timerfdSpin = 500 * time.Microsecond

// PreciseSleepUntil returns as soon as the wall clock reaches at: it
// sleeps until shortly before, then it spins yielding the processor, so
// the lateness is typically well under a microsecond rather than a
// timer's tens of microseconds to a millisecond. It returns the lateness
// (zero or more).
//
// On Linux a timerfd armed at timerfdSpin before the instant ends the
// sleep (sleepUntilWall); elsewhere, or where that fails, the runtime's
// timer, spinWindow before. The shorter spin is for every node's agent
// spinning at once at the commit: on a node each spins on its own
// processor, but in a lab whose nodes share a machine they spin on the
// processors that the dataplanes and the probes use around the instant.
//
// at is a wall instant (the coordinator expresses it in this node's
// clock), so the comparison is on the wall clock, not the monotonic one.
func PreciseSleepUntil(at time.Time) time.Duration {
	at = at.Round(0) // strip any monotonic reading: compare wall clocks
	if wake := at.Add(-timerfdSpin); time.Until(wake) <= 0 || !sleepUntilWall(wake) {
		if d := time.Until(at) - spinWindow; d > 0 {
			time.Sleep(d)
		}
	}
	for {
		now := time.Now().Round(0)
		if !now.Before(at) {
			return now.Sub(at)
		}
		runtime.Gosched()
	}
}

// FakeClock is a manual Clock for tests: time moves only by Advance, Set or
// SleepUntil, and due timers fire (in their own goroutines, like
// time.AfterFunc) when it moves. WaitTimers lets a test wait until the code
// under test has armed its timers.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	seq    int
	wg     sync.WaitGroup // fired callbacks still running
}

type fakeTimer struct {
	c     *FakeClock
	when  time.Time
	seq   int
	f     func()
	fired bool
	done  bool
}

// NewFakeClock returns a FakeClock at start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now implements Clock.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements Clock.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	c.seq++
	t := &fakeTimer{c: c, when: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	if d <= 0 {
		c.Advance(0)
	}
	return t
}

// SleepUntil implements Clock: it moves the clock to at when at is later.
func (c *FakeClock) SleepUntil(at time.Time) time.Duration {
	c.mu.Lock()
	late := c.now.Sub(at)
	c.mu.Unlock()
	if late >= 0 {
		return late
	}
	c.Set(at)
	return 0
}

// Advance moves the clock forward by d and fires the timers now due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	t := c.now.Add(d)
	c.mu.Unlock()
	c.Set(t)
}

// Set moves the clock to t (never backwards) and fires the timers due.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, tm := range c.timers {
		switch {
		case tm.done:
		case !tm.when.After(c.now):
			tm.fired, tm.done = true, true
			due = append(due, tm)
		default:
			keep = append(keep, tm)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if !due[i].when.Equal(due[j].when) {
			return due[i].when.Before(due[j].when)
		}
		return due[i].seq < due[j].seq
	})
	for _, tm := range due {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			tm.f()
		}()
	}
}

// Settle waits until every timer callback fired so far has returned
// (including callbacks fired by those callbacks).
func (c *FakeClock) Settle() { c.wg.Wait() }

// Pending returns the instants of the armed timers, earliest first.
func (c *FakeClock) Pending() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, t := range c.timers {
		if !t.done {
			out = append(out, t.when)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	return true
}
