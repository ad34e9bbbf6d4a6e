package probe

import (
	"encoding/binary"
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pacer is what a probing mesh waits on between ticks: a periodic timerfd
// in the runtime's poller, its expirations read with raw syscalls.
//
// It is not a Go timer because of what a Go timer wakes besides the
// mesh's goroutine. The thread that runs an expired timer readies the
// goroutine and starts a second, spinning thread (wakep) that finds
// nothing and sleeps again; netpoll's timeout is in whole milliseconds,
// so it wakes once early and once on time; and with every P idle between
// ticks sysmon sleeps until the next timer, is woken by the tick's first
// syscall (entersyscall) besides, and then polls every 20 µs for as long
// as a P is busy. An agent probing 3 peers every 10 ms was woken ~1,100
// times a second, ~11 per tick, for a mesh that needs one (make
// bench-agent).
//
// A timerfd that becomes readable is a goroutine the poller hands
// straight to the thread that was blocked in epoll: that thread runs it,
// nothing else is woken, and sysmon, with no timer due, sleeps on. For
// that the tick must not enter the scheduler's syscall path either: its
// reads and writes never block and go raw (sock.read, sock.write), and
// so does the read of the timerfd here. A wake is a read deadline in the
// past, which returns the wait at once.
type pacer struct {
	f     *os.File
	rc    syscall.RawConn
	read  func(fd uintptr) bool // p.readTicks, bound once: no allocation a tick
	ticks uint64
	err   error
	buf   [8]byte
}

func newPacer() (*pacer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so os.NewFile puts it in the poller.
	f := os.NewFile(uintptr(fd), "probe-ticks")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	p := &pacer{f: f, rc: rc}
	p.read = p.readTicks
	return p, nil
}

// start ticks every d from now on; stop ends the ticks.
func (p *pacer) start(d time.Duration) error {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	return p.settime(&unix.ItimerSpec{Interval: ts, Value: ts})
}

func (p *pacer) stop() error { return p.settime(&unix.ItimerSpec{}) }

func (p *pacer) settime(spec *unix.ItimerSpec) error {
	var err error
	if cerr := p.rc.Control(func(fd uintptr) { err = unix.TimerfdSettime(int(fd), 0, spec, nil) }); cerr != nil {
		return cerr
	}
	return err
}

// wake makes the current or next wait return at once. Safe from any
// goroutine, also after close.
func (p *pacer) wake() { _ = p.f.SetReadDeadline(time.Unix(1, 0)) }

// wait blocks until a tick is due or wake was called, and says how many
// ticks have come since the last wait (more than one: the mesh fell
// behind; none: woken).
func (p *pacer) wait() (uint64, error) {
	p.ticks, p.err = 0, nil
	err := p.rc.Read(p.read)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Cleared before the caller looks at what it was woken for, so a
		// wake after that look is not lost.
		return 0, p.f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		return 0, err
	}
	return p.ticks, p.err
}

// readTicks reads the timerfd's expirations: false while there are none
// (the poller waits), raw for the reason the type says.
func (p *pacer) readTicks(fd uintptr) bool {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p.buf[0])), uintptr(len(p.buf)))
		switch e {
		case 0:
			if n == uintptr(len(p.buf)) {
				p.ticks = binary.NativeEndian.Uint64(p.buf[:])
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			p.err = e
			return true
		}
	}
}

func (p *pacer) close() error { return p.f.Close() }
