// Package probes makes the coordinator's agent calls about the probe
// mesh: the counters' reset (riding in the first Prepare where the agents
// can, PrepReset), their read for the report once an operation that
// reached commit ends, the built-in mesh verifier (Verify, I7: every
// sampled pair answered a probe sent after both its nodes flipped) and
// the parking of a held operation's sample.
//
// The pass rule and the sample are internal/probemesh's; what is learnt
// is written into the operation (internal/opstate). When to call is the
// barrier core's (ResetProbes, ReadProbes, RunVerifier actions).
//
//	mesh.go      Mesh; Park
//	counters.go  the counters' reset and read, the report's figures
//	verify.go    the mesh verifier
package probes
