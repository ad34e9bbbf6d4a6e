package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/coordinator"
	"github.com/cutover-dev/cutover/coordinator/openshift"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// sdnFlags selects the openshift-sdn profile's coordinator side (cluster
// mode only): the strategy that keeps openshift-sdn from fighting the change.
type sdnFlags struct {
	strategy       string
	image          string
	healthInterval time.Duration
}

func (f *sdnFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.strategy, "openshift-sdn", "", "with --kube on OpenShift SDN: keep the SDN from fighting the change: "+
		openshift.StrategySourceOfTruthFirst+" (recreate the ClusterNetwork before commit, restart SDN pods one by one after) or "+
		openshift.StrategyFieldReport+" (roll the SDN to --openshift-sdn-image without its health check first); empty: off")
	fs.StringVar(&f.image, "openshift-sdn-image", "", "with --openshift-sdn="+openshift.StrategyFieldReport+": the SDN image built without the health check")
	fs.DurationVar(&f.healthInterval, "openshift-sdn-health-interval", 30*time.Second, "openshift-sdn's health-check interval: the plan reports how much of it the change uses")
}

// hook returns the profile's Hook, or nil when it is off. Errors name the flag.
func (f *sdnFlags) hook(rc *rest.Config, cluster bool) (coordinator.Hook, error) {
	if f.strategy == "" {
		if f.image != "" {
			return nil, fmt.Errorf("--openshift-sdn-image %q: only used with --openshift-sdn=%s", f.image, openshift.StrategyFieldReport)
		}
		return nil, nil
	}
	if !cluster {
		return nil, fmt.Errorf("--openshift-sdn %q: needs --kube (the profile acts on the ClusterNetwork and the SDN DaemonSet through the API)", f.strategy)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	cfg := openshift.Config{Client: cs, Dynamic: dyn, Strategy: f.strategy, Image: f.image,
		HealthInterval: f.healthInterval, Out: os.Stderr}.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("--openshift-sdn %q: %w", f.strategy, err)
	}
	return openshift.New(cfg)
}
