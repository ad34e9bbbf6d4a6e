package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/coordinator/kube"
	"github.com/cutover-dev/cutover/coordinator/replica"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// runCluster is --kube: in-cluster credentials (or --kubeconfig), then a
// cluster process until ctx ends or the Lease is lost.
func runCluster(ctx context.Context, cfg coordinator.Config, kcfg kube.Config, kubeconfig string, sdn *sdnFlags, log *slog.Logger) error {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("--kube: Kubernetes client config (in-cluster, or --kubeconfig %q): %w", kubeconfig, err)
	}
	var extra []coordinator.Option
	h, err := sdn.hook(rc, true)
	if err != nil {
		return err
	}
	if h != nil {
		// After the cluster Session's hook: the SDN's own source of truth
		// and pods move once the generic checks passed.
		extra = append(extra, coordinator.WithHook(h))
	}
	p, err := replica.New(cfg, kcfg, rc, log, extra...)
	if err != nil {
		return err
	}
	return p.Run(ctx)
}
