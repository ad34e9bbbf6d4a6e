// Package coordinatorv1 is the generated gRPC code of the coordinator API
// (coordinator.proto), used by coordctl.
package coordinatorv1
