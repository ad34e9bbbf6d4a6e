// Command coordinator runs the Cutover coordinator: flags → Config → Run,
// or with --kube the in-cluster mode (cluster.go): agents discovered from
// the Kubernetes API, journal in ConfigMaps, one leader on a Lease.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/coordinator/kube"
)

func main() {
	cfg := coordinator.Default()
	kcfg := kube.Default()
	fs := pflag.NewFlagSet("coordinator", pflag.ExitOnError)
	cfg.AddFlags(fs)
	kcfg.AddFlags(fs)
	var sdn sdnFlags
	sdn.addFlags(fs)
	kubeconfig := fs.String("kubeconfig", "", "with --kube: kubeconfig file to use instead of the in-cluster config (out-of-cluster runs, tests)")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "coordinator: unexpected argument %q: every setting is a flag (see -h)\n", fs.Arg(0))
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if cfg.Cluster {
		err = runCluster(ctx, cfg, kcfg, *kubeconfig, &sdn, log)
	} else if _, herr := sdn.hook(nil, false); herr != nil {
		err = herr
	} else {
		err = coordinator.Run(ctx, cfg, log)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		if errors.Is(err, kube.ErrLeaseLost) {
			// The Deployment restarts us as a standby: our in-memory state
			// may be stale, the journal is not.
			os.Exit(3)
		}
		os.Exit(1)
	}
}
