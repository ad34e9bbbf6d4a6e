package lab_test

import (
	"errors"
	"os"
	"os/exec"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The wake floor: what this machine charges a Go process for being woken
// at the probe mesh's rate and doing nothing else. The mesh wakes once per
// tick (agent/probe/pace_linux.go: a periodic timerfd in the runtime's
// poller); on a virtual machine whose cores idle between ticks a wake
// alone is tens of microseconds (the guest's idle exit and the wake-up
// path), which at 100 ticks a second is a measurable part of the 1 %
// target before any packet is sent. BenchmarkAgentFootprint runs a floor
// process beside every probing row, over the same window, so a reader
// sees how much of an agent's CPU any once-per-tick design pays here.

// wakeFloorEnv, set to an interval ("10ms"), makes the test binary a floor
// process (TestMain): it wakes on a timerfd every interval until killed.
const wakeFloorEnv = "COT_WAKE_FLOOR"

// wakeFloor is the floor process: the pacer's wait (a non-blocking
// periodic timerfd read through the runtime's poller with a raw read) and
// nothing else.
func wakeFloor(spec string) int {
	d, err := time.ParseDuration(spec)
	if err != nil || d <= 0 {
		_, _ = os.Stderr.WriteString(wakeFloorEnv + "=" + spec + ": want a positive duration\n")
		return 2
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		_, _ = os.Stderr.WriteString("timerfd: " + err.Error() + "\n")
		return 1
	}
	f := os.NewFile(uintptr(fd), "wake-floor")
	rc, err := f.SyscallConn()
	if err != nil {
		return 1
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		return 1
	}
	var buf [8]byte
	read := func(fd uintptr) bool {
		for {
			_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			if e == unix.EINTR {
				continue
			}
			return e != unix.EAGAIN
		}
	}
	for {
		if err := rc.Read(read); err != nil {
			return 1
		}
	}
}

// startWakeFloor starts this test binary as a floor process at interval d.
func startWakeFloor(d time.Duration) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), wakeFloorEnv+"="+d.String())
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// stopWakeFloor kills the floor process (by its PID) and reaps it.
func stopWakeFloor(cmd *exec.Cmd) error {
	err := cmd.Process.Kill()
	if werr := cmd.Wait(); err == nil {
		var ee *exec.ExitError
		if !errors.As(werr, &ee) {
			err = werr
		}
	}
	return err
}
