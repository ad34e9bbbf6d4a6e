// Package machineconfig plays the node-update part of OpenShift's
// machine-config-controller (MCC) when the MCC cannot: it walks the nodes of
// a MachineConfigPool to a rendered MachineConfig by the annotation protocol
// the machine-config-daemon (MCD) speaks (openshift/machine-config-operator
// pkg/daemon/constants, pkg/daemon/drain.go, pkg/controller/drain), draining
// through the Eviction API and journaling its progress in a ConfigMap so a
// killed run resumes where it stopped.
//
// The decisions are pure (Decide, Plan: no I/O, no clock); Driver is the
// I/O around them. It owns only Node annotations and spec.unschedulable,
// pod evictions and its journal ConfigMap. It must never write
// MachineConfigs or MachineConfigPools (the MCC owns them), never reboot or
// touch a node itself (the MCD does), and never run while the MCC is alive
// unless forced: two controllers answering the same drain requests would
// fight.
package machineconfig
