// Package metrics defines the coordinator's Prometheus metrics
// (cutover_coordinator_*) in a registry of its own, with the TLS
// reloaders that count certificate reloads and refusals. The
// coordinator package re-exports Metrics and NewMetrics.
//
// It measures; it decides nothing.
package metrics
