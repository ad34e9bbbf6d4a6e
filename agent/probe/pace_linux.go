package probe

import (
	"errors"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pacer is what a probing mesh waits on between ticks: a periodic timerfd
// and an eventfd that wakes it early (the peer set changed, the mesh
// ends), waited on together in one blocking ppoll.
//
// It is not a Go timer because of what a Go timer wakes besides the
// mesh's goroutine. With every P idle between ticks, the runtime parks
// sysmon until the next timer, and the first syscall of the tick
// (entersyscall) wakes it again, after which it polls at 20 µs for as long
// as a P is busy; the thread that runs the timer starts a second, spinning
// thread (wakep) that finds nothing and sleeps again; and netpoll's
// timeout is in whole milliseconds, so it wakes once early and once on
// time. An agent probing 3 peers every 10 ms was woken ~1,100 times a
// second, ~11 per tick, for a mesh that needs one (make bench-agent).
//
// A goroutine blocked in ppoll keeps its thread and its P (in _Psyscall):
// the tick wakes that thread alone, and its reads and writes (raw
// syscalls, never blocking: sock.read and sock.write) do not re-enter the
// scheduler. Sysmon, seeing a P in a syscall, no longer sleeps until the
// next timer but polls at its slowest, every 10 ms, whatever the
// interval. It does not take the P away while each wait is shorter than
// its 10 ms grace and another P is idle; with none idle it does, within
// one of its polls, which is why the agent runs with at least two Ps
// (agent/cmd/agent).
type pacer struct {
	tfd, efd int
	fds      [2]unix.PollFd
	buf      [8]byte
	// mu orders a wake from another goroutine (the context's end) before
	// close, so that it never writes to a closed, maybe reused, number.
	mu     sync.Mutex
	closed bool
}

func newPacer() (*pacer, error) {
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(tfd)
		return nil, err
	}
	p := &pacer{tfd: tfd, efd: efd}
	p.fds = [2]unix.PollFd{{Fd: int32(tfd), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	return p, nil
}

// start ticks every d from now on; stop ends the ticks.
func (p *pacer) start(d time.Duration) error {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	return unix.TimerfdSettime(p.tfd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil)
}

func (p *pacer) stop() error {
	return unix.TimerfdSettime(p.tfd, 0, &unix.ItimerSpec{}, nil)
}

// wake makes the current or next wait return at once. Safe from any
// goroutine.
func (p *pacer) wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		one := [8]byte{1}
		_, _ = unix.Write(p.efd, one[:])
	}
}

// wait blocks until a tick is due or wake was called, and says how many
// ticks have come since the last wait (more than one: the mesh fell
// behind).
func (p *pacer) wait() (ticks uint64, err error) {
	for {
		// Blocking: the runtime must know this thread is in a syscall
		// (Syscall6, not the raw call), so that a stop of the world
		// does not wait for the next tick.
		_, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&p.fds[0])), 2, 0, 0, 0, 0)
		if e != 0 && e != unix.EINTR {
			return 0, e
		}
		woken := p.drain(p.efd) > 0
		ticks = p.drain(p.tfd)
		if ticks > 0 || woken {
			return ticks, nil
		}
	}
}

// drain reads fd's counter (a timerfd's expirations, an eventfd's sum),
// zero when there is nothing.
func (p *pacer) drain(fd int) uint64 {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p.buf[0])), 8)
	if e != 0 || r != 8 {
		return 0
	}
	return *(*uint64)(unsafe.Pointer(&p.buf[0]))
}

func (p *pacer) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return errors.Join(unix.Close(p.tfd), unix.Close(p.efd))
}
