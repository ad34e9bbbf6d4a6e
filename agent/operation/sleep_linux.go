package operation

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// sleepUntilWall blocks until the wall clock reaches at and reports
// whether it could. A timerfd on CLOCK_REALTIME armed at the absolute
// instant wakes it: the kernel's hrtimer fires on time, and the poller
// hands the goroutine to the thread blocked in epoll, so nothing runs
// until then.
func sleepUntilWall(at time.Time) bool {
	fd, err := unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return false
	}
	// Non-blocking, so os.NewFile puts it in the poller: the read below
	// parks the goroutine, not a thread.
	f := os.NewFile(uintptr(fd), "commit-instant")
	defer func() { _ = f.Close() }()
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(at.UnixNano())}
	if err := unix.TimerfdSettime(fd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
		return false
	}
	var expirations [8]byte
	_, err = f.Read(expirations[:])
	return err == nil
}
