package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a process the lab started, identified by PID and start time so
// that a PID the kernel reused for something else is never signalled.
type Proc struct {
	Role  string `json:"role"` // ovsdb-server, ovs-vswitchd, agent, coordinator
	Node  string `json:"node"` // n<i> or hub
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/<pid>/stat starttime (clock ticks since boot)
}

func (p Proc) String() string { return fmt.Sprintf("%s/%s pid %d", p.Node, p.Role, p.PID) }

// procStat returns the start time and state of pid.
func procStat(pid int) (start uint64, state byte, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	s := string(data)
	// Fields after the parenthesised comm (which may hold spaces and ')').
	j := strings.LastIndexByte(s, ')')
	if j < 0 || j+2 >= len(s) {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unparsable", pid)
	}
	f := strings.Fields(s[j+2:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0][0], err
}

func newProc(role, node string, pid int) (Proc, error) {
	start, _, err := procStat(pid)
	if err != nil {
		return Proc{}, fmt.Errorf("lab: %s %s pid %d: %w", node, role, pid, err)
	}
	return Proc{Role: role, Node: node, PID: pid, Start: start}, nil
}

// Alive reports whether the recorded process still runs (not a zombie, and
// the PID not reused).
func (p Proc) Alive() bool {
	start, state, err := procStat(p.PID)
	return err == nil && start == p.Start && state != 'Z'
}

// stopProcs sends SIGTERM to every live process, waits up to grace for them
// to go, then SIGKILLs what is left and waits again.
func stopProcs(ps []Proc, grace time.Duration) error {
	var live []Proc
	for _, p := range ps {
		if p.Alive() {
			_ = syscall.Kill(p.PID, syscall.SIGTERM)
			live = append(live, p)
		}
	}
	live = waitGone(live, grace)
	for _, p := range live {
		if p.Alive() {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	live = waitGone(live, 5*time.Second)
	var errs []error
	for _, p := range live {
		errs = append(errs, fmt.Errorf("lab: %s still running after SIGKILL", p))
	}
	return errors.Join(errs...)
}

func waitGone(ps []Proc, d time.Duration) []Proc {
	deadline := time.Now().Add(d)
	for {
		var live []Proc
		for _, p := range ps {
			if p.Alive() {
				live = append(live, p)
			}
		}
		if len(live) == 0 || time.Now().After(deadline) {
			return live
		}
		ps = live
		time.Sleep(20 * time.Millisecond)
	}
}

// procsInNetns lists processes whose network namespace is the named one
// (what `ip netns pids` does), except this process: netns.Do may have
// moved one of our threads there.
func procsInNetns(name string) ([]Proc, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", name), &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("lab: stat netns %s: %w", name, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var ps syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/ns/net", &ps) != nil {
			continue
		}
		if ps.Dev == st.Dev && ps.Ino == st.Ino {
			if p, err := newProc("stray", name, pid); err == nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}
