// Package labcli is the command tree of cutover-lab, the lab's own binary
// (harness/cmd/cutover-lab): bring a local lab (harness/lab) up, inspect it,
// tear it down, and run coordctl against its coordinator.
//
// It is harness, not product: no shipped binary may link it (the
// coordinator image carries coordctl, which must not carry the lab, its
// OVS processes and the SDN simulator; conventions_test.go checks). It
// reuses coordctl's command tree (coordinator/cli) whole as the
// `cutover-lab coordctl` command, which is what the forwarded commands run
// inside the lab's hub namespace, and coordctl's exit codes throughout.
package labcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cutover-dev/cutover/coordinator/cli"
	"github.com/cutover-dev/cutover/harness/lab"
)

// Name is the binary's name as users type it; help and hints use it.
const Name = "cutover-lab"

// coordctlCmd is the command that runs coordctl itself; forwarded
// commands re-run this binary with it in the lab's hub namespace.
const coordctlCmd = "coordctl"

// labForwarded are the coordctl commands `cutover-lab <cmd>` runs against
// a lab's coordinator (`cutover-lab ctl` forwards any other).
var labForwarded = []struct{ name, short string }{
	{"cutover", "coordctl cutover against the lab's coordinator (e.g. cutover-lab cutover --port 4889)"},
	{"rollback", "coordctl rollback against the lab's coordinator"},
	{"plan", "coordctl plan against the lab's coordinator"},
	{"agents", "coordctl agents against the lab's coordinator"},
}

// globals are the persistent flags and the output streams every command
// shares.
type globals struct {
	Stdout, Stderr io.Writer
	Output         string // text or json
}

func (g *globals) JSON() bool { return g.Output == "json" }

// Exit codes are coordctl's (coordctl help exit-codes): a forwarded
// command's code passes through unchanged, so the lab's own must mean the
// same.
const (
	exitOK     = cli.ExitOK
	exitFailed = cli.ExitFailed
	exitUsage  = cli.ExitUsage
)

// usageError is a bad-input error (exit 2).
func usageError(format string, args ...any) error { return cli.Exitf(exitUsage, format, args...) }

// NewRoot builds the cutover-lab command tree writing to stdout and stderr.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{Stdout: stdout, Stderr: stderr}
	root := &cobra.Command{
		Use:   Name,
		Short: "A local N-node lab (network namespaces, real OVS or kernel VXLAN, real agents and coordinator)",
		Long: `Bring up, inspect and tear down a local lab: N nodes, each a network
namespace with its own Open vSwitch (or a kernel VXLAN device), the real
agent in each, the real coordinator in a hub namespace, mTLS on, and an
overlay probe mesh that measures disruption. Needs root. See docs/lab.md.

The lab's coordinator listens on its management network (198.18.128.1:9444),
which only the lab's namespaces reach. Run coordctl commands against it with
"cutover-lab <command>": cutover-lab re-runs itself as coordctl inside the
lab's hub namespace with the lab's address and admin certificate, e.g.

  cutover-lab up --nodes 8
  cutover-lab cutover --port 4889
  cutover-lab rollback
  cutover-lab ctl status          # any other coordctl command
  cutover-lab exec n3 -- ovs-vsctl get interface vxlan0 options:dst_port
  cutover-lab down

Pick another lab with --name NAME (or --dir DIR) before the command's own
arguments: cutover-lab cutover --name demo --port 4889.

This is a test harness, built apart from the shipped binaries (make lab);
it carries coordctl whole as "cutover-lab coordctl".`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if g.Output != "text" && g.Output != "json" {
				return usageError("-o/--output %q: unknown format, want text or json", g.Output)
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Flag parsing errors are usage errors (exit 2), as in coordctl.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError("%v (see %s --help)", err, cmd.CommandPath())
	})
	root.PersistentFlags().StringVarP(&g.Output, "output", "o", "text", "output format: text or json")
	addLabCommands(root, g)
	root.AddCommand(&cobra.Command{
		Use:                coordctlCmd + " COMMAND [ARGS...]",
		Short:              "Run coordctl itself (this binary carries it; the forwarded commands run it in the lab's hub namespace)",
		DisableFlagParsing: true, // ARGS are coordctl's
		RunE: func(_ *cobra.Command, args []string) error {
			if code := cli.Execute(args, g.Stdout, g.Stderr); code != exitOK {
				return reported(code)
			}
			return nil
		},
	})
	return root
}

// reported is the exit code of a command that has already printed its
// error (coordctl run in process).
type reported int

func (r reported) Error() string { return fmt.Sprintf("exit code %d", int(r)) }

// Execute runs cutover-lab with args, writing to stdout and stderr, and
// returns the exit code.
func Execute(args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var r reported
	if errors.As(err, &r) {
		return int(r)
	}
	var ee *cli.ExitError
	if !errors.As(err, &ee) {
		// Errors that are not ours come from cobra itself: unknown command,
		// wrong number of arguments. Those are usage errors.
		ee = &cli.ExitError{Code: exitUsage, Err: err}
	}
	_, _ = fmt.Fprintf(stderr, "%s: %v\n", Name, ee.Err)
	return ee.Code
}

// Main is Execute on the process's stdout and stderr.
func Main(args []string) int { return Execute(args, os.Stdout, os.Stderr) }

// addLabCommands adds the lab's own commands (up, down, status, exec) and
// the ones forwarded to its coordinator to root.
func addLabCommands(root *cobra.Command, g *globals) {
	var cfg lab.Config
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "Create a lab and start its agents and coordinator",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			for _, b := range []struct {
				flag, name string
				dst        *string
			}{{"agent-bin", "agent", &cfg.AgentBin}, {"coordinator-bin", "coordinator", &cfg.CoordinatorBin}} {
				if !fs.Changed(b.flag) {
					*b.dst = siblingBinary(b.name, *b.dst)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			l, err := lab.Up(ctx, cfg)
			if err != nil {
				return labError(err)
			}
			st, err := l.Status(ctx)
			if err != nil {
				return labError(err)
			}
			_, _ = fmt.Fprintf(g.Stdout, "lab %s up in %s\n%s", l.Name(), time.Since(start).Round(time.Millisecond), st)
			_, _ = fmt.Fprint(g.Stdout, labHints(l))
			return nil
		},
	}
	cfg.AddFlags(upCmd.Flags())

	var sel labSelector
	downCmd := &cobra.Command{
		Use:   "down",
		Short: "Stop every process of a lab and delete its namespaces and files (also after a crash)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := sel.config()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			if err := lab.Teardown(ctx, c); err != nil {
				return labError(err)
			}
			_, _ = fmt.Fprintf(g.Stdout, "lab %s down\n", c.Name)
			return nil
		},
	}
	sel.addFlags(downCmd)

	var statusSel labSelector
	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "Show a lab's nodes, their VXLAN port read from the dataplane, and its processes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := statusSel.load()
			if err != nil {
				return err
			}
			st, err := l.Status(cmd.Context())
			if err != nil {
				return labError(err)
			}
			if g.JSON() {
				enc := json.NewEncoder(g.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			_, _ = fmt.Fprint(g.Stdout, st)
			return nil
		},
	}
	statusSel.addFlags(statusCmd)

	var execSel labSelector
	execCmd := &cobra.Command{
		Use:   "exec NODE -- COMMAND [ARGS...]",
		Short: "Run a command inside a lab node's namespace (hub for the hub); ovs-* tools talk to that node's own OVS",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usageError("lab exec %s: want NODE -- COMMAND (e.g. cutover-lab exec n1 -- ovs-vsctl show)", strings.Join(args, " "))
			}
			l, err := execSel.load()
			if err != nil {
				return err
			}
			c, err := l.Command(cmd.Context(), args[0], args[1:]...)
			if err != nil {
				return labError(err)
			}
			// On coordctl's own stdio: a forwarded cutover draws its live
			// table on the terminal, an interactive shell works.
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, g.Stdout, g.Stderr
			return exitOf(c.Run(), fmt.Sprintf("lab %s: %s on %s", l.Name(), args[1], args[0]))
		},
	}
	execSel.addFlags(execCmd)

	root.AddCommand(upCmd, downCmd, statusCmd, execCmd)
	for _, f := range labForwarded {
		root.AddCommand(forwardCmd(g, f.name, f.name, f.short))
	}
	root.AddCommand(forwardCmd(g, "ctl", "", "Run any coordctl command against the lab's coordinator (cutover-lab ctl status)"))
}

// labSelector picks a recorded lab by name or dir.
type labSelector struct{ name, dir string }

func (s *labSelector) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.name, "name", "lab", "lab name")
	cmd.Flags().StringVar(&s.dir, "dir", "", "lab dir (default /run/cutover-lab/<name>)")
}

func (s *labSelector) config() (lab.Config, error) {
	c := lab.Config{Name: s.name, Dir: s.dir}.Default()
	if err := c.Validate(); err != nil {
		return c, &cli.ExitError{Code: exitUsage, Err: err}
	}
	return c, nil
}

func (s *labSelector) load() (*lab.Lab, error) {
	c, err := s.config()
	if err != nil {
		return nil, err
	}
	l, err := lab.Load(c.Dir)
	if err != nil {
		return nil, labError(err)
	}
	return l, nil
}

// labError maps lab errors to exit codes: bad config is a usage error, no
// such lab is one too (the user named it), the rest failed.
func labError(err error) error {
	var ce *lab.ConfigError
	switch {
	case errors.As(err, &ce), lab.IsNotFound(err):
		if lab.IsNotFound(err) {
			err = fmt.Errorf("%w (cutover-lab up creates one; --name/--dir pick another)", err)
		}
		return &cli.ExitError{Code: exitUsage, Err: err}
	case lab.IsExists(err):
		return &cli.ExitError{Code: exitUsage, Err: err}
	}
	return &cli.ExitError{Code: exitFailed, Err: err}
}

// siblingBinary is the binary name next to the running cutover-lab when
// it exists (an installed or `make build` tree), else def.
func siblingBinary(name, def string) string {
	self, err := os.Executable()
	if err != nil {
		return def
	}
	p := filepath.Join(filepath.Dir(self), name)
	if st, err := os.Stat(p); err == nil && !st.IsDir() {
		return p
	}
	return def
}

func labHints(l *lab.Lab) string {
	sel := ""
	if l.Name() != "lab" {
		sel = " --name " + l.Name()
	}
	if l.Dir() != lab.DefaultDir(l.Name()) {
		sel = " --dir " + l.Dir()
	}
	port := 4889
	if l.Config().Port == port {
		port = 4789
	}
	// The coordinator's default strategy decides how a cutover that names
	// none moves the nodes: the lab's atomic, or the product's auto.
	how := "at once"
	if l.Config().DefaultStrategy == "auto" {
		how = "(strategy auto: the report says which ran)"
	}
	return fmt.Sprintf(`
next:
  cutover-lab cutover%[1]s --port %[2]d     # move every node to port %[2]d %[4]s, with a report
  cutover-lab rollback%[1]s                 # put every node back on the port before the last operation
  cutover-lab status%[1]s                   # ports read back from every node's dataplane
  cutover-lab exec%[1]s n1 -- %[3]s
  cutover-lab down%[1]s
`, sel, port, readbackHint(l.Config().Backend), how)
}

func readbackHint(backend string) string {
	if backend == lab.BackendKernelVXLAN {
		return "ip -d link show flannel.1"
	}
	return "ovs-vsctl get interface vxlan0 options:dst_port"
}

// forwardCmd is `cutover-lab <name> ARGS`: coordctl <target> ARGS run in
// the lab's hub namespace with the lab's coordinator address and admin
// identity. target "" forwards ARGS as they are (ctl).
func forwardCmd(g *globals, name, target, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name + " [--name LAB | --dir DIR] [ARGS...]",
		Short:              short,
		DisableFlagParsing: true, // ARGS are the forwarded command's
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, rest, err := splitLabArgs(args)
			if err != nil {
				return err
			}
			if len(rest) == 1 && (rest[0] == "-h" || rest[0] == "--help") && target == "" {
				return cmd.Help()
			}
			if target != "" {
				rest = append([]string{target}, rest...)
			}
			if len(rest) == 0 {
				return usageError("lab %s: no coordctl command given (e.g. cutover-lab ctl status)", name)
			}
			l, err := sel.load()
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return cli.Exitf(exitFailed, "lab %s: cannot find %s's own binary to run coordctl in the hub namespace: %v", name, Name, err)
			}
			// This binary carries coordctl (the coordctl command): the
			// coordctl run in the hub is the same build as the lab's.
			argv := append([]string{self, coordctlCmd}, l.CoordctlArgs()...)
			c, err := l.Command(cmd.Context(), "hub", append(argv, rest...)...)
			if err != nil {
				return labError(err)
			}
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, g.Stdout, g.Stderr
			return exitOf(c.Run(), fmt.Sprintf("lab %s: coordctl %s (in namespace %s)", l.Name(), rest[0], lab.HubNetns(l.Name())))
		},
	}
}

// splitLabArgs takes the lab selection flags (--name, --dir) out of a
// forwarded command line and refuses the connection flags the lab sets.
func splitLabArgs(args []string) (labSelector, []string, error) {
	sel := labSelector{name: "lab"}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		key, val, hasVal := strings.Cut(a, "=")
		var dst *string
		switch key {
		case "--name":
			dst = &sel.name
		case "--dir":
			dst = &sel.dir
		case "--coordinator", "--tls-dir", "--tls-ca", "--tls-cert", "--tls-key", "--insecure":
			return sel, nil, usageError("%s: cutover-lab sets the coordinator address and TLS identity of the lab itself; run plain coordctl to reach another coordinator", key)
		}
		if dst == nil {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return sel, nil, usageError("%s: needs a value", key)
			}
			i++
			val = args[i]
		}
		*dst = val
	}
	return sel, rest, nil
}

// exitOf passes the exit code of a command cutover-lab ran on its own
// stdio (an *exec.Cmd from harness/lab, which builds the command line that
// enters a lab namespace) on.
func exitOf(err error, what string) error {
	if err == nil {
		return nil
	}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) && ec.ExitCode() > 0 {
		return &cli.ExitError{Code: ec.ExitCode(), Err: fmt.Errorf("%s: exit code %d", what, ec.ExitCode())}
	}
	return cli.Exitf(exitFailed, "%s: %v", what, err)
}
