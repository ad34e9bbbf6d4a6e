package agent

import (
	"fmt"

	"github.com/cutover-dev/cutover/agent/dataplane"
)

// NewBackend builds the dataplane backend cfg asks for. It is the one place
// where backends are chosen and constructed from flags: wiring a real
// backend means replacing a case here and nothing else. Run retries it
// every --backend-retry while it fails (OVS may start after the agent), so
// an error must say what is missing.
func NewBackend(cfg Config) (dataplane.Backend, error) {
	switch cfg.Backend {
	case BackendOVS:
		return nil, fmt.Errorf("backend %s (ovsdb %s, bridge %s, interface %s): not built yet in this agent version",
			cfg.Backend, cfg.OVSDB, cfg.Bridge, cfg.Interface)
	case BackendKernelVXLAN:
		return nil, fmt.Errorf("backend %s (device %s): not built yet in this agent version", cfg.Backend, cfg.KernelDevice)
	}
	return nil, fmt.Errorf("--backend %q: unknown backend: want %s or %s", cfg.Backend, BackendOVS, BackendKernelVXLAN)
}
