package lab_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
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
	return ticking(d, nil)
}

// ticking waits on a timerfd every d as the pacer does and runs tick
// (when not nil) on every wake, until the process is killed.
func ticking(d time.Duration, tick func()) int {
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
		if tick != nil {
			tick()
		}
	}
}

// The mesh floor: the least a once-per-tick probe mesh can do with the
// agent's datagrams on this machine. One process per lab node, woken as
// the wake floor is, reads what arrived in one recvmmsg (with receive
// stamps, as the agent asks) and sends one probe-sized datagram to each
// of its peers (the pairs the agents probe: lab.ProbePeersOf) in one
// sendmmsg; no Go code past that, no answers, no counters. Beside the
// agents' rows at the same rate it says how much of an agent's CPU any
// such design pays here, packets included, and how much is the agent's.

// meshFloorEnv, set to "interval,listen,peer,...", makes the test binary a
// mesh floor node (TestMain), started in the node's namespace.
const meshFloorEnv = "COT_MESH_FLOOR"

// meshFloorPort is the mesh floor's port on the overlay addresses; no lab
// process uses it.
const meshFloorPort = 9498

// meshFloorDatagram is what the mesh floor sends: a probe carrying one
// answer (agent/probe: 21 bytes and 16 an answer), what a steady
// symmetric mesh sends.
const meshFloorDatagram = 37

func meshFloor(spec string) int {
	fail := func(err error) int {
		_, _ = os.Stderr.WriteString(meshFloorEnv + "=" + spec + ": " + err.Error() + "\n")
		return 2
	}
	parts := strings.Split(spec, ",")
	if len(parts) < 3 {
		return fail(errors.New("want interval,listen,peer[,peer...]"))
	}
	d, err := time.ParseDuration(parts[0])
	if err != nil || d <= 0 {
		return fail(fmt.Errorf("interval %q: want a positive duration", parts[0]))
	}
	listen, err := netip.ParseAddrPort(parts[1])
	if err != nil || !listen.Addr().Is4() {
		return fail(fmt.Errorf("listen %q: want an IPv4 address and port", parts[1]))
	}
	peers := make([]unix.RawSockaddrInet4, len(parts)-2)
	for i, p := range parts[2:] {
		ap, err := netip.ParseAddrPort(p)
		if err != nil || !ap.Addr().Is4() {
			return fail(fmt.Errorf("peer %q: want an IPv4 address and port", p))
		}
		peers[i] = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&peers[i].Port))[:], ap.Port())
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(listen.Port()), Addr: listen.Addr().As4()}); err != nil {
		return fail(fmt.Errorf("bind %s: %w", listen, err))
	}
	var payload [meshFloorDatagram]byte
	out := make([]mmsghdr, len(peers))
	outIov := make([]unix.Iovec, len(peers))
	for i := range peers {
		outIov[i] = unix.Iovec{Base: &payload[0]}
		outIov[i].SetLen(len(payload))
		out[i].hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&peers[i])), Namelen: unix.SizeofSockaddrInet4, Iov: &outIov[i]}
		out[i].hdr.SetIovlen(1)
	}
	const batch = 64 // agent/probe's
	in := make([]mmsghdr, batch)
	inIov := make([]unix.Iovec, batch)
	inBuf := make([][1500]byte, batch)
	inOOB := make([][128]byte, batch)
	return ticking(d, func() {
		for {
			for i := range in { // the kernel writes back lengths
				inIov[i] = unix.Iovec{Base: &inBuf[i][0]}
				inIov[i].SetLen(len(inBuf[i]))
				in[i].hdr = unix.Msghdr{Iov: &inIov[i], Control: &inOOB[i][0]}
				in[i].hdr.SetIovlen(1)
				in[i].hdr.SetControllen(len(inOOB[i]))
			}
			m, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&in[0])), batch, unix.MSG_DONTWAIT, 0, 0)
			if e != 0 || m < batch {
				break
			}
		}
		_, _, _ = unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&out[0])), uintptr(len(out)), unix.MSG_DONTWAIT, 0, 0)
		runtime.KeepAlive(payload)
	})
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
