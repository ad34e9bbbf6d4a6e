// Command sdnsim is the openshift-sdn stand-in of one lab node (package
// sdnsim): it reads the VXLAN port from the ClusterNetwork on the
// apiserver, sets the node's br0 up (rebuilding it when it is not already
// set up for that port), owns the SDN's iptables chains, and exits with
// code 2 when its health check finds vxlan0 on another port.
//
// In a lab it runs in the host namespace: the apiserver is on loopback
// there, and the node's Open vSwitch is reached over its unix sockets, as
// the SDN container reaches the host's; iptables and ip run in --netns. On
// the real-cluster tier it runs as the sdn DaemonSet's pod: host network,
// the node's /var/run/openvswitch mounted, in-cluster credentials.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cutover-dev/cutover/harness/sdnsim"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		node, kubeconfig, ovsDir, netns, flows, addr, hwaddr string
		mtu                                                  int
		interval                                             time.Duration
		noHealth                                             bool
	)
	fs := flag.NewFlagSet("sdnsim", flag.ContinueOnError)
	fs.StringVar(&node, "node", "", "node name (for logs)")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the apiserver holding the ClusterNetwork; empty: in-cluster (run as the sdn DaemonSet's pod)")
	fs.StringVar(&ovsDir, "ovs-dir", "", "the node's OVS_RUNDIR (db.sock, br0.mgmt)")
	fs.StringVar(&netns, "netns", "", "the node's network namespace (iptables, ip)")
	fs.StringVar(&flows, "flows-file", "", "the pods' br0 flows, re-attached at a rebuild")
	fs.StringVar(&addr, "addr", "", "br0's address, prefix form (the pod gateway), restored at a rebuild")
	fs.StringVar(&hwaddr, "hwaddr", "", "br0's MAC, kept across a rebuild")
	fs.IntVar(&mtu, "mtu", 0, "br0's MTU, restored at a rebuild")
	fs.DurationVar(&interval, "health-interval", sdnsim.DefaultHealthInterval, "health-check (and iptables re-sync) interval")
	fs.BoolVar(&noHealth, "no-health-check", false, "the field report's patched image: never exit on a failed health check")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return sdnsim.ExitSetup
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", node)
	bad := func(flag, value, why string) int {
		log.Error(fmt.Sprintf("--%s %q: %s", flag, value, why))
		return sdnsim.ExitSetup
	}
	if ovsDir == "" {
		return bad("ovs-dir", ovsDir, "required")
	}
	if interval <= 0 {
		return bad("health-interval", interval.String(), "must be positive")
	}
	var pfx netip.Prefix
	if addr != "" {
		var err error
		if pfx, err = netip.ParsePrefix(addr); err != nil {
			return bad("addr", addr, "want address/length, e.g. 198.19.1.1/16")
		}
	}
	// In a pod (the real-cluster tier runs it as openshift-sdn's
	// DaemonSet) it reads the ClusterNetwork as the SDN does: with its
	// service account.
	rc, err := rest.InClusterConfig()
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return bad("kubeconfig", kubeconfig, err.Error())
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return bad("kubeconfig", kubeconfig, err.Error())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	n := &sdnsim.OVSNode{OVSDir: ovsDir, Netns: netns, FlowsFile: flows, Addr: pfx, MTU: mtu, HWAddr: hwaddr}
	if err := n.Reconnect(ctx); err != nil {
		log.Error("ovsdb", "err", err)
		return sdnsim.ExitSetup
	}
	defer func() { _ = n.Close() }()
	err = sdnsim.Run(ctx, sdnsim.Config{NodeName: node, Source: sdnsim.ClusterNetwork{Client: dyn}, Node: n,
		HealthInterval: interval, NoHealthCheck: noHealth, Events: os.Stdout})
	switch {
	case err == nil:
		return sdnsim.ExitOK
	case sdnsim.IsHealth(err):
		log.Error("exiting", "err", err)
		return sdnsim.ExitHealthCheck
	default:
		log.Error("setup failed", "err", err)
		return sdnsim.ExitSetup
	}
}
