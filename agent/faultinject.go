//go:build cutover_faultinject

package agent

import (
	"math/rand/v2"
	"os"
	"time"
)

// FaultInjectEnv names the node whose agent flips at Prepare instead of at
// the commit instant: a deliberate I2 violation, so that the lab's
// independent I2 observer can be shown to catch one (STYLE.md "a safety
// test must bite"). This file is compiled only with the build tag
// cutover_faultinject, which only the lab's test harness sets
// (harness/lab/labtest.FaultInjectBinaries); the shipped agent
// (Makefile, Dockerfile.agent) is built without it, and there the switch
// is a constant false (faultinject_off.go): no flag, no environment
// variable, nothing in the DaemonSet can turn it on.
const FaultInjectEnv = "COT_FAULTINJECT_FLIP_AT_PREPARE"

// FaultInjectBuilt says whether this binary carries the switch.
const FaultInjectBuilt = true

func flipAtPrepare(node string) bool {
	v := os.Getenv(FaultInjectEnv)
	return v != "" && v == node
}

// FaultInjectPathEnv names the node whose agent reports every frame of a
// path check as answered and received, whatever the underlay did: a
// check that does not check, so that the lab's path check tests can be
// shown to catch one.
const FaultInjectPathEnv = "COT_FAULTINJECT_PATH_PASSES"

func pathAlwaysPasses(node string) bool {
	v := os.Getenv(FaultInjectPathEnv)
	return v != "" && v == node
}

// FaultInjectFlipDelayEnv, set to a duration D, makes every agent flip at
// a random moment 0-D after the commit instant instead of at it: a barrier
// that does not hold (in the lab, at D = 150 ms the product reported
// SUCCEEDED at a 142 ms commit spread, 340 probes lost), so that the lab's
// end-to-end spread bounds and the report's spread warning can be shown
// to catch one.
const FaultInjectFlipDelayEnv = "COT_FAULTINJECT_FLIP_DELAY"

func flipDelay() func() time.Duration {
	d, err := time.ParseDuration(os.Getenv(FaultInjectFlipDelayEnv))
	if err != nil || d <= 0 {
		return nil
	}
	return func() time.Duration { return rand.N(d) }
}

// FaultInjectPathWireEnv names the node whose agent reports every peer's
// frame to the port under test as seen arriving on its interfaces (the
// packet capture's evidence) whatever the underlay did: a capture that
// sees what never came, so that an underlay block taken for the node's own
// firewall can be shown to be caught.
const FaultInjectPathWireEnv = "COT_FAULTINJECT_PATH_WIRE"

func pathWireAlways(node string) bool {
	v := os.Getenv(FaultInjectPathWireEnv)
	return v != "" && v == node
}
