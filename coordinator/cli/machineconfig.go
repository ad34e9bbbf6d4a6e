package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cutover-dev/cutover/coordinator/machineconfig"
)

const machineconfigExitHelp = `Exit codes of coordctl machineconfig:
  0  rollout Succeeded (every chosen node on the config, state Done); dry run
     or status printed
  1  another error; or stopped for someone else: another rollout of the
     pool took over the journal, or the machine-config-controller came back
     mid-way (it carries on)
  2  bad input: a flag, an unknown pool, a config not of the pool, a
     selector matching no node of the pool, --max-unavailable 0; nothing
     was changed
  3  the API server is unreachable or refused the credentials
  4  refused: the machine-config-controller looks alive (its Lease is
     renewed); nothing was changed. --force overrides
  5  the rollout stopped FAILED: a node went Degraded/Unreconcilable (the
     MCD's reason is printed), a wait or a drain timed out, or a drain was
     refused (emptyDir pods). The node is left as it is; fix it and run
     rollout again to resume
  6  interrupted (Ctrl-C): the journal says Running; run rollout again to
     resume where it stopped`

// kubeFlags are how coordctl machineconfig reaches the API server: itself,
// from the host network, since the pod network and the kubernetes Service
// may be down (that is when this command is needed).
type kubeFlags struct {
	kubeconfig string
	server     string
}

func (k *kubeFlags) add(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&k.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig with the credentials (default $KUBECONFIG)")
	cmd.PersistentFlags().StringVar(&k.server, "server", "", "API server address, overriding the kubeconfig's (e.g. https://<master-host-ip>:6443: a master's host address, not the kubernetes Service)")
}

func (k *kubeFlags) cluster(g *Globals) (*machineconfig.Cluster, error) {
	if k.kubeconfig == "" {
		return nil, usageError("--kubeconfig: required (or $KUBECONFIG): in-cluster credentials go through the kubernetes Service, which may be down")
	}
	if k.server != "" {
		u, err := url.Parse(k.server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, usageError("--server %q: want an https URL such as https://<master-host-ip>:6443", k.server)
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags(k.server, k.kubeconfig)
	if err != nil {
		return nil, usageError("--kubeconfig %q: %v", k.kubeconfig, err)
	}
	rc.Timeout = g.Timeout
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, usageError("--kubeconfig %q: %v", k.kubeconfig, err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, usageError("--kubeconfig %q: %v", k.kubeconfig, err)
	}
	return &machineconfig.Cluster{Kube: cs, Dynamic: dyn}, nil
}

func newMachineConfigCmd(g *Globals) *cobra.Command {
	k := &kubeFlags{}
	cmd := &cobra.Command{
		Use:   "machineconfig",
		Short: "Play the machine-config-controller's node updates when it cannot (break glass)",
		Long: `When the machine-config-controller cannot run (after an SDN-to-OVN
migration switched half way: the pod network is down and it reaches the
API through the kubernetes Service), roll a
MachineConfigPool's nodes to a rendered MachineConfig by the
machine-config-daemon's annotation protocol: desiredConfig, drain on
request, lastAppliedDrain, uncordon on request after the reboot, until
currentConfig. coordctl talks to the API server itself (--server), not to
the coordinator. See docs/machineconfig.md.

` + machineconfigExitHelp,
	}
	k.add(cmd)
	cmd.AddCommand(newMCStatusCmd(g, k), newMCRolloutCmd(g, k))
	return cmd
}

func newMCStatusCmd(g *Globals, k *kubeFlags) *cobra.Command {
	var pool, journalNS string
	cmd := &cobra.Command{
		Use:   "status --pool P",
		Short: "Per-node config, MCD state and drain annotations of a pool; whether the MCC looks alive",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pool == "" {
				return usageError("--pool: required: the MachineConfigPool (e.g. worker)")
			}
			c, err := k.cluster(g)
			if err != nil {
				return err
			}
			st, err := (&machineconfig.Driver{C: c}).Status(cmd.Context(), pool, journalNS)
			if err != nil {
				return mcError(err, nil, k)
			}
			if g.JSON() {
				return writeAnyJSON(g.Stdout, st)
			}
			renderMCStatus(g.Stdout, st)
			return nil
		},
	}
	cmd.Flags().StringVar(&pool, "pool", "", "MachineConfigPool")
	cmd.Flags().StringVar(&journalNS, "journal-namespace", machineconfig.MCCNamespace, "namespace of the rollout journal ConfigMap")
	return cmd
}

func newMCRolloutCmd(g *Globals, k *kubeFlags) *cobra.Command {
	o := machineconfig.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "rollout --pool P [--config rendered-…] [--nodes N,…|--selector S] [--max-unavailable 1|N%]",
		Short: "Roll a pool's nodes to a rendered config by the MCD's annotation protocol",
		Long: `Roll the pool's nodes (or the ones --nodes/--selector pick) to --config
(default: the pool's spec.configuration.name), at most --max-unavailable at
a time, in node-name order: set desiredConfig; when the MCD asks
(desiredDrain=drain-<config>) cordon and evict the node's pods through the
Eviction API (PodDisruptionBudgets honoured, DaemonSet and mirror pods
skipped), answer lastAppliedDrain; wait through the reboot for
uncordon-<config>, uncordon, answer; wait for currentConfig and state Done.

A node the MCD reports Degraded or Unreconcilable stops the rollout and is
left as it is. Progress is journaled in a ConfigMap (--journal-namespace):
run the same command again after an interruption or a fix and it resumes
from each node's step. Refused while the machine-config-controller's Lease
is being renewed, unless --force.

` + machineconfigExitHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Pool == "" {
				return usageError("--pool: required: the MachineConfigPool (e.g. worker)")
			}
			if len(o.Nodes) > 0 && o.Selector != "" {
				return usageError("--nodes %s and --selector %q: give one of them", strings.Join(o.Nodes, ","), o.Selector)
			}
			c, err := k.cluster(g)
			if err != nil {
				return err
			}
			o.Progress = func(ev machineconfig.Event) {
				_, _ = fmt.Fprintf(g.Stderr, "%s  %-20s %-20s %s\n", ev.Time.Format("15:04:05"), ev.Node, ev.Step, ev.Msg)
			}
			rep, err := (&machineconfig.Driver{C: c}).Rollout(cmd.Context(), o)
			if rep != nil {
				if g.JSON() {
					if jerr := writeAnyJSON(g.Stdout, rep); jerr != nil {
						return jerr
					}
				} else {
					renderMCReport(g.Stdout, rep)
				}
			}
			if err != nil {
				return mcError(err, rep, k)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Pool, "pool", "", "MachineConfigPool to roll out")
	f.StringVar(&o.Config, "config", "", "rendered MachineConfig of the pool (default: the pool's spec.configuration.name; a journaled rollout's when resuming)")
	f.StringSliceVar(&o.Nodes, "nodes", nil, "only these nodes of the pool (comma-separated)")
	f.StringVar(&o.Selector, "selector", "", "only the pool's nodes matching this label selector")
	f.StringVar(&o.MaxUnavailable, "max-unavailable", o.MaxUnavailable, "nodes updated at once: a count or a percentage of the nodes rolled out (rounded down, at least 1)")
	f.DurationVar(&o.Timeouts.Drain, "drain-timeout", o.Timeouts.Drain, "limit of one node's drain (evictions a PodDisruptionBudget refuses are retried until then)")
	f.DurationVar(&o.Timeouts.MCD, "node-timeout", o.Timeouts.MCD, "limit of each wait for the MCD: its drain request, the reboot up to its uncordon request, currentConfig")
	f.BoolVar(&o.Drain.DeleteEmptyDirData, "delete-emptydir-data", false, "evict pods with emptyDir volumes (their data is lost); without it they stop the drain")
	f.BoolVar(&o.DryRun, "dry-run", false, "validate and print each node's step and next action; change nothing")
	f.BoolVar(&o.Force, "force", false, "run even though the machine-config-controller looks alive (it would answer the same requests)")
	f.StringVar(&o.JournalNamespace, "journal-namespace", o.JournalNamespace, "namespace of the journal ConfigMap "+machineconfig.JournalName("<pool>"))
	f.DurationVar(&o.Poll, "poll", o.Poll, "how often the nodes are read while waiting")
	_ = f.MarkHidden("poll")
	return cmd
}

// mcError maps a machineconfig error to an exit code.
func mcError(err error, rep *machineconfig.Report, k *kubeFlags) error {
	var (
		refused *machineconfig.RefusedError
		ue      *url.Error
		ne      net.Error
	)
	switch {
	case machineconfig.IsInput(err):
		return &ExitError{Code: ExitUsage, Err: err}
	case errors.As(err, &refused):
		return Exitf(ExitProblems, "refused, nothing changed: %v", err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if rep != nil && rep.State == machineconfig.RolloutRunning {
			return Exitf(ExitInterrupted, "interrupted: the journal %s says Running; run the same rollout again to resume", rep.Journal)
		}
		return Exitf(ExitInterrupted, "interrupted before the rollout started: %v", err)
	case errors.As(err, new(*machineconfig.MCCBackError)):
		return Exitf(ExitFailed, "stopped: %v", err)
	case errors.Is(err, machineconfig.ErrJournalConflict):
		return Exitf(ExitFailed, "stopped: %v; the other run carries on (see coordctl machineconfig status)", err)
	case apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err):
		return Exitf(ExitUnreachable, "API server %s refused the credentials of --kubeconfig %s: %v", orDash(k.server), k.kubeconfig, err)
	case rep != nil && rep.State == machineconfig.RolloutFailed:
		return Exitf(ExitOpFailed, "rollout FAILED: %v", err)
	case errors.As(err, &ue) || errors.As(err, &ne):
		return Exitf(ExitUnreachable, "API server unreachable (--server %s, --kubeconfig %s): %v", orDash(k.server), k.kubeconfig, err)
	}
	return &ExitError{Code: ExitFailed, Err: err}
}

func writeAnyJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return Exitf(ExitFailed, "encoding JSON: %v", err)
	}
	return nil
}

func renderMCStatus(w io.Writer, st *machineconfig.PoolStatus) {
	_, _ = fmt.Fprintf(w, "pool %s: spec config %s, status config %s, newest rendered %s", st.Pool, orDash(st.SpecConfig), orDash(st.StatusConfig), orDash(st.Newest))
	if st.Paused {
		_, _ = fmt.Fprint(w, " (paused)")
	}
	_, _ = fmt.Fprintln(w)
	_, _ = fmt.Fprintf(w, "machine-config-controller: %s (%s)\n", map[bool]string{true: "ALIVE", false: "not alive"}[st.MCC.Alive], st.MCC.Why)
	if r := st.Rollout; r != nil {
		_, _ = fmt.Fprintf(w, "rollout journal: %s to %s, %s since %s", r.State, r.Config, r.Started.Format(time.RFC3339), r.Updated.Format(time.RFC3339))
		if r.Error != "" {
			_, _ = fmt.Fprintf(w, ": %s", r.Error)
		}
		_, _ = fmt.Fprintln(w)
	}
	renderMCNodes(w, statusRows(st.Nodes))
}

type mcRow struct {
	v    machineconfig.NodeView
	step machineconfig.Step
	next machineconfig.Action
}

func statusRows(ns []machineconfig.NodeStatus) []mcRow {
	out := make([]mcRow, 0, len(ns))
	for _, n := range ns {
		out = append(out, mcRow{v: n.NodeView, step: n.Step})
	}
	return out
}

func renderMCNodes(w io.Writer, rows []mcRow) {
	tw := newTable(w)
	_, _ = fmt.Fprintln(tw, "NODE\tSTEP\tCURRENT\tDESIRED\tSTATE\tDESIRED-DRAIN\tLAST-APPLIED-DRAIN\tREADY\tCORDONED\tNEXT\tREASON")
	for _, r := range rows {
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.v.Name, r.step, orDash(r.v.Current), orDash(r.v.Desired), orDash(r.v.State),
			orDash(r.v.DesiredDrain), orDash(r.v.LastAppliedDrain), yesNo(r.v.Ready), yesNo(r.v.Unschedulable), orDash(string(r.next)), orDash(r.v.Reason))
	}
	_ = tw.Flush()
}

func renderMCReport(w io.Writer, rep *machineconfig.Report) {
	resumed := ""
	if rep.Resumed {
		resumed = " (resumed)"
	}
	_, _ = fmt.Fprintf(w, "rollout of pool %s to %s%s: %s, max unavailable %d, journal %s\n", rep.Pool, rep.Config, resumed, rep.State, rep.MaxUnavailable, rep.Journal)
	_, _ = fmt.Fprintf(w, "machine-config-controller: %s (%s)\n", map[bool]string{true: "ALIVE", false: "not alive"}[rep.MCC.Alive], rep.MCC.Why)
	if rep.Error != "" {
		_, _ = fmt.Fprintf(w, "error: %s\n", rep.Error)
	}
	rows := make([]mcRow, 0, len(rep.Nodes))
	for _, n := range rep.Nodes {
		rows = append(rows, mcRow{v: n.NodeView, step: n.Step, next: n.Next})
	}
	renderMCNodes(w, rows)
}
