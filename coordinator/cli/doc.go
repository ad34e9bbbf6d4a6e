// Package cli is coordctl: the command-line client of the coordinator's
// gRPC API (CoordinatorService) over mutual TLS, one file per subcommand
// (agents, plan, cutover, status, report, rollback, certs, version); the
// change record page is a template embedded from changerecord/.
//
// It owns flag parsing and validation, rendering (text tables, live
// progress, protojson) and exit codes. Every bad input is rejected here,
// naming the flag, the value and the reason, before any connection is made;
// the coordinator validates again and its gRPC status messages are printed
// as they are, never as a Go dump.
//
// It must not reach agents or the dataplane itself: everything goes through
// the coordinator. The one exception is machineconfig, which talks to the
// Kubernetes API server directly (package coordinator/machineconfig): it
// is needed when the cluster's own controllers cannot reach it. Other command groups plug in with AddCommand. The lab is
// not one: coordctl ships in the coordinator image, so the lab's commands
// are their own binary (harness/cmd/cutover-lab), which carries coordctl.
//
// Exit codes (also `coordctl help exit-codes`):
//
//	0  success (cutover SUCCEEDED; plan without problems; rollback done)
//	1  operation ABORTED or ROLLED_BACK (cluster consistent on the old port); other errors
//	2  bad input (flags, arguments, or InvalidArgument/NotFound from the coordinator)
//	3  coordinator unreachable, TLS/mTLS failure, not authorised
//	4  plan/preflight problems, FailedPrecondition; nothing changed
//	5  operation ended FAILED: operator needed
//	6  stream ended without a final report: the operation may still be running
package cli
