//go:build cutover_faultinject

package probe

import (
	"os"
	"strconv"
)

// FaultInjectDropEnv makes the mesh ignore every n-th answer it receives
// (by sequence number) as if it never arrived: a deliberate meter bug, so
// that the lab's agreement check against an independent meter
// (harness/lab TestMeterAgreementBites) can be shown to catch one. This
// file is compiled only with the build tag cutover_faultinject, which only
// the lab's test harness sets (harness/lab/labtest.FaultInjectAgent); in the
// shipped agent dropAnswer is a constant false (faultinject_off.go).
const FaultInjectDropEnv = "COT_FAULTINJECT_PROBE_DROP_EVERY"

// FaultInjectBuilt says whether this binary carries the switch.
const FaultInjectBuilt = true

// FaultInjectHideLossEnv, set to 1, makes the mesh count every probe it
// settles as received, answered or not: the opposite meter bug, a mesh
// that reports no loss whatever the network dropped, so that the lab's
// agreement check can be shown to bound the mesh from below as well
// (harness/lab TestMeterAgreementBitesHiddenLoss).
const FaultInjectHideLossEnv = "COT_FAULTINJECT_PROBE_HIDE_LOSS"

// FaultInjectRideToAllEnv, set to 1, makes the mesh put its answers in
// its probes to every peer, whether the peer's probe said it reads them
// or not: an agent that forgot the older agents of a rolling upgrade
// (TestRidingAnswersSpareOlderAgentsBites).
const FaultInjectRideToAllEnv = "COT_FAULTINJECT_PROBE_RIDE_TO_ALL"

var (
	rideAll      = os.Getenv(FaultInjectRideToAllEnv) == "1"
	dropEvery, _ = strconv.ParseUint(os.Getenv(FaultInjectDropEnv), 10, 64)
	hideLoss     = os.Getenv(FaultInjectHideLossEnv) == "1"
)

func dropAnswer(seq uint64) bool { return dropEvery > 0 && seq%dropEvery == 0 }

func hiddenLoss() bool { return hideLoss }

func rideToAll() bool { return rideAll }
