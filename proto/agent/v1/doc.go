// Package agentv1 is the generated gRPC code of the agent API
// (agent.proto): what the coordinator asks of one node's agent.
package agentv1
