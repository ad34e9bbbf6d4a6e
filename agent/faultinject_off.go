//go:build !cutover_faultinject

package agent

import "time"

// FaultInjectBuilt says whether this binary carries the test-only I2
// mutation switch (faultinject.go, build tag cutover_faultinject). The
// shipped agent never does: flipAtPrepare is a constant false and the
// compiler drops the mutation.
const FaultInjectBuilt = false

func flipAtPrepare(string) bool { return false }

func pathAlwaysPasses(string) bool { return false }

func flipDelay() func() time.Duration { return nil }

func pathWireAlways(string) bool { return false }
