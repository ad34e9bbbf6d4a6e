// Package ovsproc runs one private Open vSwitch (ovsdb-server and
// ovs-vswitchd with the userspace datapath) in a directory of its own and,
// optionally, inside a named network namespace.
//
// It owns the two daemons' lifecycle only: it creates the database, starts
// the daemons, waits until ovs-vswitchd follows the database, and stops them
// again by PID. It must not configure bridges or ports beyond what a caller
// asks through Vsctl/Ofctl/Appctl, and it must never touch a system Open
// vSwitch: every path (database, sockets, pidfiles, logs) lives under Dir.
//
// With datapath_type=netdev, a bridge's internal port is a tap device created
// in ovs-vswitchd's network namespace, so two instances in one namespace
// collide on device names like br0: give each instance its own Netns.
package ovsproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

// Schema is the Open_vSwitch database schema shipped by openvswitch-common.
const Schema = "/usr/share/openvswitch/vswitch.ovsschema"

// StopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
var StopGrace = 5 * time.Second

// Options says where an Instance lives.
type Options struct {
	Dir   string // working dir for db, sockets, logs, pidfiles (required; created)
	Netns string // optional named netns (pkg/netns) to run ovs-vswitchd (and ovsdb-server) in
}

// Instance is one running private Open vSwitch.
type Instance struct {
	Dir, Netns string
	DBSock     string // unix socket path of ovsdb-server, Dir/db.sock

	mu       sync.Mutex
	db       *daemon
	vswitchd *daemon
}

// daemon is one child process we started. done is closed once Wait returned,
// so Stop never signals a PID that the kernel may have reused.
type daemon struct {
	name string
	pid  int
	done chan struct{}
}

// Start creates a fresh database in o.Dir, starts ovsdb-server and
// ovs-vswitchd, and returns once ovs-vswitchd has applied the database's
// configuration. On any failure it stops whatever it started.
func Start(ctx context.Context, o Options) (*Instance, error) {
	if o.Dir == "" {
		return nil, errors.New("ovsproc: Options.Dir is empty: a working directory is required")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("ovsproc: Options.Dir %q: %w", o.Dir, err)
	}
	// Unix socket paths are limited to 108 bytes; fail here with a clear
	// reason instead of an obscure bind error in the daemon's log.
	if len(dir)+len("/ovs-vswitchd.ctl") >= 108 {
		return nil, fmt.Errorf("ovsproc: Options.Dir %q: too long for unix socket paths (max ~90 bytes)", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ovsproc: Options.Dir %q: %w", o.Dir, err)
	}
	i := &Instance{Dir: dir, Netns: o.Netns, DBSock: filepath.Join(dir, "db.sock")}

	db := filepath.Join(dir, "conf.db")
	_ = os.Remove(db)
	if out, err := exec.CommandContext(ctx, "ovsdb-tool", "create", db, Schema).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ovsproc: ovsdb-tool create %s %s: %w: %s", db, Schema, err, strings.TrimSpace(string(out)))
	}
	if err := i.startDB(ctx); err != nil {
		_ = i.Stop()
		return nil, err
	}
	if err := i.startVswitchd(ctx); err != nil {
		_ = i.Stop()
		return nil, err
	}
	return i, nil
}

func (i *Instance) startDB(ctx context.Context) error {
	d, err := i.spawn("ovsdb-server", filepath.Join(i.Dir, "conf.db"),
		"--remote=punix:"+i.DBSock,
		"--pidfile="+filepath.Join(i.Dir, "ovsdb-server.pid"),
		"--unixctl="+filepath.Join(i.Dir, "ovsdb-server.ctl"),
		"--log-file="+filepath.Join(i.Dir, "ovsdb-server.log"),
		"-vconsole:off", "-vfile:info")
	if err != nil {
		return err
	}
	i.mu.Lock()
	i.db = d
	i.mu.Unlock()
	// Without --detach nothing tells us when the socket listens: retry the
	// initial (no-wait) init until it connects or the daemon dies.
	return i.until(ctx, d, 10*time.Second, func(ctx context.Context) error {
		_, err := i.vsctl(ctx, "--no-wait", "init")
		return err
	})
}

func (i *Instance) startVswitchd(ctx context.Context) error {
	d, err := i.spawn("ovs-vswitchd", "unix:"+i.DBSock,
		// No kernel module here: never try the system (kernel) datapath.
		"--disable-system",
		"--pidfile="+filepath.Join(i.Dir, "ovs-vswitchd.pid"),
		"--unixctl="+filepath.Join(i.Dir, "ovs-vswitchd.ctl"),
		"--log-file="+filepath.Join(i.Dir, "ovs-vswitchd.log"),
		"-vconsole:off", "-vfile:info")
	if err != nil {
		return err
	}
	i.mu.Lock()
	i.vswitchd = d
	i.mu.Unlock()
	// ovs-vsctl without --no-wait bumps next_cfg and waits until
	// ovs-vswitchd reports it in cur_cfg: that is "up and following".
	return i.until(ctx, d, 20*time.Second, func(ctx context.Context) error {
		_, err := i.vsctl(ctx, "--timeout=5", "init")
		return err
	})
}

// spawn starts name as a child (inside Netns when set). `ip netns exec`
// execs the program in place, so the child's PID is the daemon's PID.
func (i *Instance) spawn(name string, args ...string) (*daemon, error) {
	cmd := i.rawCommand(name, args...)
	cmd.Env = append(os.Environ(), i.Env()...)
	// Own process group: a ^C aimed at the test or lab must not kill the
	// daemons behind our back; Stop does that, by PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.OpenFile(filepath.Join(i.Dir, name+".stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ovsproc: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("ovsproc: start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	d := &daemon{name: name, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(d.done)
	}()
	return d, nil
}

// until retries probe until it succeeds, the daemon exits, or the timeout.
func (i *Instance) until(ctx context.Context, d *daemon, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 6*time.Second)
		last = probe(pctx)
		pcancel()
		if last == nil {
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("ovsproc: %s (pid %d) exited during start-up: %w; see %s", d.name, d.pid, last, i.logTail(d.name))
		case <-ctx.Done():
			return fmt.Errorf("ovsproc: %s (pid %d) not ready after %s: %w; see %s", d.name, d.pid, timeout, last, i.logTail(d.name))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logTail names the daemon's log and quotes its last lines, so a start-up
// failure explains itself in the test output.
func (i *Instance) logTail(name string) string {
	var b strings.Builder
	for _, f := range []string{name + ".log", name + ".stderr"} {
		p := filepath.Join(i.Dir, f)
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 5 {
			lines = lines[len(lines)-5:]
		}
		fmt.Fprintf(&b, "%s: %s; ", p, strings.Join(lines, " | "))
	}
	if b.Len() == 0 {
		return filepath.Join(i.Dir, name+".log")
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// Env points every OVS tool at this instance's directory instead of the
// system's /var/run/openvswitch, /etc/openvswitch and /var/log/openvswitch.
func (i *Instance) Env() []string {
	return []string{
		"OVS_RUNDIR=" + i.Dir,
		"OVS_DBDIR=" + i.Dir,
		"OVS_LOGDIR=" + i.Dir,
		"OVS_SYSCONFDIR=" + i.Dir,
	}
}

// Command returns a command that runs an ovs-* tool against this instance
// (environment set, inside Netns when set).
func (i *Instance) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if i.Netns != "" {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", i.Netns, name}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
	}
	cmd.Env = append(os.Environ(), i.Env()...)
	return cmd
}

func (i *Instance) rawCommand(name string, args ...string) *exec.Cmd {
	if i.Netns != "" {
		return exec.Command("ip", append([]string{"netns", "exec", i.Netns, name}, args...)...)
	}
	return exec.Command(name, args...)
}

// hostCommand runs a client tool in the caller's namespace: ovs-vsctl,
// ovs-ofctl and ovs-appctl only speak to unix sockets under Dir, which are
// reachable from any network namespace, and skipping `ip netns exec` saves
// a mount namespace per call.
func (i *Instance) hostCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), i.Env()...)
	return cmd
}

// Vsctl runs ovs-vsctl against this instance's database. Without a
// --no-wait among args it waits for ovs-vswitchd to apply the change.
func (i *Instance) Vsctl(ctx context.Context, args ...string) (string, error) {
	return i.vsctl(ctx, append([]string{"--timeout=10"}, args...)...)
}

func (i *Instance) vsctl(ctx context.Context, args ...string) (string, error) {
	return run(i.hostCommand(ctx, "ovs-vsctl", append([]string{"--db=unix:" + i.DBSock}, args...)...))
}

// Ofctl runs ovs-ofctl; a bridge argument resolves to Dir/<bridge>.mgmt.
func (i *Instance) Ofctl(ctx context.Context, args ...string) (string, error) {
	return run(i.hostCommand(ctx, "ovs-ofctl", args...))
}

// Appctl runs ovs-appctl against this instance's ovs-vswitchd.
func (i *Instance) Appctl(ctx context.Context, args ...string) (string, error) {
	return run(i.hostCommand(ctx, "ovs-appctl", append([]string{"-t", filepath.Join(i.Dir, "ovs-vswitchd.ctl")}, args...)...))
}

func run(cmd *exec.Cmd) (string, error) {
	out, err := execseam.Run(cmd, "")
	return string(out), err
}

// VswitchdPID is the PID of the running ovs-vswitchd, 0 when none runs.
func (i *Instance) VswitchdPID() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.vswitchd == nil || i.vswitchd.exited() {
		return 0
	}
	return i.vswitchd.pid
}

// DBServerPID is the PID of the running ovsdb-server, 0 when none runs.
func (i *Instance) DBServerPID() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.db == nil || i.db.exited() {
		return 0
	}
	return i.db.pid
}

// RestartVswitchd stops ovs-vswitchd by PID and starts it again; the
// database (and so the configuration) is kept.
func (i *Instance) RestartVswitchd(ctx context.Context) error {
	i.mu.Lock()
	d := i.vswitchd
	i.vswitchd = nil
	i.mu.Unlock()
	if d != nil {
		if err := d.stop(); err != nil {
			return err
		}
	}
	if err := i.startVswitchd(ctx); err != nil {
		return err
	}
	return nil
}

// Stop stops ovs-vswitchd, then ovsdb-server, each by PID: SIGTERM, then
// SIGKILL after StopGrace. It is idempotent and safe on a partial Start.
func (i *Instance) Stop() error {
	i.mu.Lock()
	vs, db := i.vswitchd, i.db
	i.mu.Unlock()
	var errs []error
	// vswitchd first: it would otherwise spin reconnecting to a dead db.
	for _, d := range []*daemon{vs, db} {
		if d == nil {
			continue
		}
		if err := d.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) stop() error {
	if d.exited() {
		return nil
	}
	// Signalling is safe from PID reuse: d.done is closed only after Wait
	// reaped the child, and until then the PID stays ours.
	_ = syscall.Kill(d.pid, syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(StopGrace):
	}
	_ = syscall.Kill(d.pid, syscall.SIGKILL)
	select {
	case <-d.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("ovsproc: %s (pid %d) still running after SIGKILL", d.name, d.pid)
	}
}

// PIDAlive reports whether pid names a live (not zombie) process; tests use
// it to prove Stop left nothing behind.
func PIDAlive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Field 3, after the parenthesised comm (which may hold spaces).
	s := string(data)
	j := strings.LastIndexByte(s, ')')
	if j < 0 || j+2 >= len(s) {
		return false
	}
	return s[j+2] != 'Z'
}
